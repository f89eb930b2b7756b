"""edgeq.fleet.engine: what ansible-doc shows; the work is the action plugin's (edgeq.ansible)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine
short_description: Build, inspect, profile and gate an INT8 TensorRT engine on a board
description:
  - Validates an ONNX model on the board as C(edgeq fleet validate) validates it on each target, over the
    task's own connection. The model is cleaned and linted once for the whole play on the machine running
    Ansible (the first board's task does it, the others wait for it); then, on the board, the model and
    edgeq's agent are uploaded into its content-addressed cache (sent only when the board does not hold
    those bytes), the board probed, the engine built with TensorRT (or taken from a board of the same kind,
    O(build_once_per_kind)), its layers inspected, its latency and throughput profiled, and the
    precision gate applied to its layers.
  - Everything lands on the machine running Ansible under O(dest), one C(targets/<host>/) directory a board
    (stages.json, deploy.log, probe.json, engine.plan, layers.json, profile.json, report.json, report.html,
    row.json), as in a fleet directory of C(edgeq fleet validate).
  - Idempotent. A board whose record in O(previous) (by default its own directory under O(dest)) passed with
    the same model, target settings and options is probed again and, when it is still what it was (TensorRT,
    GPU, compute capability, L4T), reused without a build; C(changed) is true only when an engine was built.
  - A board that fails (unreachable, a refused host key or login, a failed build, a failed gate) fails its
    task, so C(max_fail_percentage) and C(serial) count it; its result still says why.
  - Runs on the machine running Ansible (an action plugin) and needs edgeq there
    (C(pip install 'edgeq[ansible]')); the board needs Python 3.8 and TensorRT 8.6 (or its trtexec).
    The board is read from the inventory as in M(edgeq.fleet.facts).
author:
  - edgeq maintainers
version_added: 1.0.0
options:
  model:
    description:
      - The ONNX model on the machine running Ansible, explicit INT8 (Q/DQ, as C(edgeq quantize) writes it)
        or float (built without INT8 unless O(calib_cache) is given; the int8 gate then says so).
      - Relative to the directory ansible-playbook runs in. One of O(model) and O(prepared).
    type: path
  prepared:
    description:
      - A directory C(edgeq fleet validate --engine ansible) prepared the model into (its C(host/)), used as
        it is. One of O(model) and O(prepared).
    type: path
  calib_cache:
    description:
      - A TensorRT calibration cache for a float O(model) (implicit INT8).
    type: path
  dest:
    description:
      - The directory the boards' records go to (C(targets/<host>/)), on the machine running Ansible;
        relative to the directory ansible-playbook runs in.
    type: path
    default: runs/ansible
  previous:
    description:
      - A board directory of an earlier run to resume from (C(<fleet dir>/targets/<host>)); by default the
        board's own directory under O(dest).
    type: path
  gate:
    description:
      - The precision gate's policy over the target's own (C(edgeq_gate) in the inventory), as C(--gate).
    type: str
  gate_allow:
    description:
      - ONNX node names (or fnmatch patterns) the gate lets run in higher precision, added to the target's.
    type: list
    elements: str
    default: []
  gate_require_fusion:
    description:
      - Require every residual Add to be fused (over the policy's own setting).
    type: bool
  fp16:
    description:
      - Let layers without a fast INT8 kernel run FP16 (trtexec C(--fp16)); by default the target's
        C(build.fp16).
    type: bool
  iterations:
    description:
      - Profile iterations at least (trtexec C(--iterations)).
    type: int
    default: 10
  duration:
    description:
      - Profile seconds at least (trtexec C(--duration)).
    type: float
    default: 3.0
  min_shapes:
    description:
      - trtexec C(--minShapes) for a model with dynamic inputs.
    type: str
    default: ""
  opt_shapes:
    description:
      - trtexec C(--optShapes) for a model with dynamic inputs (the engine is timed at these).
    type: str
    default: ""
  max_shapes:
    description:
      - trtexec C(--maxShapes) for a model with dynamic inputs.
    type: str
    default: ""
  build_once_per_kind:
    description:
      - Build one engine per kind (compute capability + TensorRT version) in the play; the other boards of
        that kind wait for it and load it.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description:
      - Says whether an engine would be built (no earlier record with these inputs, or the board changed)
        without building, timing or writing anything on the board but the agent in its cache.
  diff_mode:
    support: none
    description: Nothing to compare.
notes:
  - An engine only loads on the TensorRT and GPU kind it was built on; edgeq's rules are measured on
    TensorRT 8.6 only.
seealso:
  - module: edgeq.fleet.facts
  - module: edgeq.fleet.release
"""

EXAMPLES = r"""
- name: Validate the model on every board of the group
  edgeq.fleet.engine:
    model: models/resnet50.int8.onnx
    dest: runs/resnet50
    build_once_per_kind: true
  register: validated

- name: Say which layers did not run INT8
  ansible.builtin.debug:
    msg: "{{ validated.gate.violations | map(attribute='layer_name') | list }}"
  when: not validated.gate.passed
"""

RETURN = r"""
status:
  description: The board's verdict, as the matrix of C(edgeq fleet validate) says it.
  returned: always
  type: str
  sample: passed
row:
  description: The board's row of C(fleet.json) (reachable, TensorRT, GPU, kind, build, gate, latency,
    throughput, report, run directory, error, cause, exit code).
  returned: when the board was tried
  type: dict
build:
  description: C(ok) (built here), C(reused) (from a board of the same kind, or an earlier passed run),
    C(failed) or C(not run).
  returned: when the board was tried
  type: str
engine:
  description: The engine's kind, TensorRT version, GPU and compute capability.
  returned: when the board was tried
  type: dict
precisions:
  description: Compute layers by precision (INT8, FP16, FP32).
  returned: when the engine was inspected
  type: dict
  sample: {"INT8": 72, "FP16": 1}
layers:
  description: Each engine layer's name, kind and precision.
  returned: when the engine was inspected
  type: list
  elements: dict
reformats:
  description: Reformat layers at the network's boundary and inside it (index and name).
  returned: when the engine was inspected
  type: dict
gate:
  description: The gate's verdict (passed, policy, summary) and its reasons (violations, allowed).
  returned: when the engine was inspected
  type: dict
timings:
  description: Latency median and p99 (ms), throughput (qps), build seconds, the board's seconds.
  returned: when the board was tried
  type: dict
files:
  description: The board's report files on the machine running Ansible (report.html, report.json,
    layers.json, profile.json, engine.plan, stages.json, deploy.log).
  returned: when the board got a run directory
  type: dict
"""
