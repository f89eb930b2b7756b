"""edgeq.fleet.facts: what ansible-doc shows; the work is the action plugin's (edgeq.ansible)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: facts
short_description: What a Jetson or GPU board is, as edgeq's probe sees it
description:
  - Ships edgeq's agent to the board (into its content-addressed cache under the target's C(work_dir), sent
    only when the board does not hold those bytes yet) and runs its probe there, over the task's own
    connection.
  - Returns the board's L4T release and the JetPack it belongs to, TensorRT, each GPU and its compute
    capability, the engine kind (compute capability and TensorRT; boards of one kind load each other's
    engines), DLA cores, free disk where runs are written, the nvpmodel power mode, CUDA, the driver and
    Python, as one fact, the mapping C(edgeq_board) (the inventory's C(edgeq_<key>) variables are target-file
    keys, which facts of those names would override).
  - Runs on the machine running Ansible (an action plugin), which needs edgeq installed
    (C(pip install 'edgeq[ansible]')); the board needs only Python 3.8 and TensorRT (or trtexec).
  - The board is read from the inventory as C(edgeq fleet validate) reads one (C(ansible_host),
    C(ansible_port), C(ansible_user), C(ansible_ssh_private_key_file), and target-file keys as
    C(edgeq_<key>) variables, e.g. C(edgeq_known_hosts), C(edgeq_python), C(edgeq_backend),
    C(edgeq_trtexec), C(edgeq_work_dir), C(edgeq_tensorrt)).
  - Host keys are verified as OpenSSH does; the task fails when C(host_key_checking) is off or the ssh
    arguments turn strict checking off.
author:
  - edgeq maintainers
version_added: 1.0.0
options: {}
attributes:
  check_mode:
    support: full
    description: Reads only (the agent is put into the board's cache, as Ansible puts its own modules).
  diff_mode:
    support: none
    description: Nothing to compare.
  facts:
    support: full
    description: Returns the C(edgeq_board) fact.
notes:
  - Set C(gather_facts) to false for boards without the Python Ansible's own setup module needs; this module
    does not need it.
seealso:
  - module: edgeq.fleet.engine
  - module: edgeq.fleet.release
"""

EXAMPLES = r"""
- name: Probe every board
  edgeq.fleet.facts:

- name: Refuse boards without TensorRT 8.6
  ansible.builtin.assert:
    that: edgeq_board.tensorrt is version('8.6', '>=') and edgeq_board.tensorrt is version('8.7', '<')
    fail_msg: "{{ inventory_hostname }} runs TensorRT {{ edgeq_board.tensorrt }}"
"""

RETURN = r"""
ansible_facts:
  description: The board's facts.
  returned: success
  type: dict
  contains:
    edgeq_board:
      description: What edgeq's probe says of the board.
      type: dict
      contains:
        tensorrt:
          description: TensorRT version (C(null) when the probe found none).
          type: str
          sample: 8.6.2
        gpu:
          description: The first GPU's name.
          type: str
          sample: Orin
        compute_capability:
          description: The first GPU's compute capability.
          type: str
          sample: "8.7"
        kind:
          description: Compute capability and TensorRT version; boards of one kind load each other's engines.
          type: str
          sample: sm8.7-trt8.6.2
        gpus:
          description: Every GPU the probe found (name, compute capability, memory, where it was read).
          type: list
          elements: dict
        sources:
          description: Where each of tensorrt, gpu and compute_capability came from (probe or target file).
          type: dict
        l4t:
          description: The L4T (Jetson Linux) release, from /etc/nv_tegra_release; C(null) off Jetson.
          type: str
          sample: 36.2.0
        jetpack:
          description: The JetPack that L4T release belongs to (NVIDIA's JetPack archive).
          type: str
          sample: 6.0 DP
        jetson:
          description: Jetson model, SoC, family, DLA device nodes (the device tree); C(null) off Jetson.
          type: dict
        dla_cores:
          description: DLA cores (TensorRT's count with the python backend, else the DLA device nodes).
          type: int
        disk:
          description: Free and total bytes where the agent writes its runs.
          type: dict
        power_mode:
          description: The nvpmodel power mode set now (id, name, default id); C(null) off Jetson.
          type: dict
          sample: {"id": 0, "name": "MAXN", "default": 2}
        cuda:
          description: CUDA runtime, the CUDA the driver supports, the toolkit installed.
          type: dict
        driver:
          description: The NVIDIA kernel driver's version.
          type: str
        python:
          description: The board's Python version (the target's C(python)).
          type: str
        backend:
          description: The agent backend that answered (python or trtexec).
          type: str
"""
