"""edgeq.fleet.release: what ansible-doc shows; the work is the action plugin's (edgeq.ansible)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: release
short_description: Install, roll back or read an edgeq release bundle on a board
description:
  - O(state=installed) installs a release bundle (C(edgeq release)) as C(edgeq release install) installs it on
    each board. The bundle is verified once for the play on the machine running Ansible (every file against
    its manifest, and its signature when O(allowed_signers) is given); on the board, the engine built for
    its kind (compute capability + TensorRT version) is uploaded into its content-addressed cache, checked
    against the manifest's sha256, unpacked into C(<work_dir>/releases/<version>/), loaded and timed there.
    Only when the gate passes and the throughput is at least O(min_ratio) times the bundle's recorded
    figure is C(releases/current) switched, atomically and compare-and-swap (only while it still points
    where it pointed when the task began, so of two installs racing on one board the later is refused).
    A board that fails keeps its C(current).
  - O(state=rolled_back) switches C(current) back to the version before it (compare-and-swap as well).
  - O(state=status) reads what the board runs, from the board itself.
  - C(changed) is true only when C(current) was switched; installing the version a board already runs
    checks it again and changes nothing.
  - Runs on the machine running Ansible (an action plugin) and needs edgeq there; the board is read from the
    inventory as in M(edgeq.fleet.facts).
author:
  - edgeq maintainers
version_added: 1.0.0
options:
  state:
    description:
      - C(installed), C(rolled_back) or C(status).
    type: str
    default: installed
    choices: [installed, rolled_back, status]
  bundle:
    description:
      - The release bundle (.tar.gz) on the machine running Ansible; relative to the directory
        ansible-playbook runs in.
        Required with O(state=installed).
    type: path
  allowed_signers:
    description:
      - An ssh-keygen allowed-signers file; only a bundle signed (C(edgeq release sign)) by one of its keys
        is installed.
    type: path
  gate:
    description:
      - The precision gate's policy over the target's own, as C(--gate).
    type: str
  min_ratio:
    description:
      - The board's measured throughput over the bundle's recorded one, at least.
    type: float
    default: 0.9
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
attributes:
  check_mode:
    support: full
    description:
      - Reads C(current) (and, to install, which engine of the bundle fits the board) and says what would
        change; nothing is uploaded, unpacked or switched.
  diff_mode:
    support: none
    description: Nothing to compare.
notes:
  - Use C(serial) and C(max_fail_percentage) for canary batches; an unreachable board fails its task, so it
    counts.
seealso:
  - module: edgeq.fleet.engine
"""

EXAMPLES = r"""
# In a play with serial: [2, "100%"] and max_fail_percentage: 0, the first two boards are the canary.
- name: Install the release, switched only where it passed on the board
  edgeq.fleet.release:
    bundle: releases/resnet50-2026-11.tar.gz
    allowed_signers: keys/allowed_signers

- name: Roll back
  edgeq.fleet.release:
    state: rolled_back

- name: What each board runs
  edgeq.fleet.release:
    state: status
  register: running
"""

RETURN = r"""
status:
  description: C(installed), C(ok) (rollback, status), C(failed), C(skipped), C(not run) or C(interrupted).
  returned: always
  type: str
current:
  description: The version C(releases/current) points at after the task.
  returned: when the board answered
  type: str
  sample: net-20260201T000000Z-1a2b3c4d
previous:
  description: What C(current) pointed at when the task began (install), or the version a rollback left.
  returned: when the board answered
  type: str
kind:
  description: The bundle's engine kind installed on the board.
  returned: state=installed
  type: str
gate:
  description: Whether the installed engine passed the gate on the board.
  returned: state=installed, once checked
  type: bool
throughput_qps:
  description: The installed engine's measured throughput.
  returned: state=installed, once timed
  type: float
ratio:
  description: Measured over recorded throughput.
  returned: state=installed, once timed
  type: float
row:
  description: The board's row as C(edgeq release install --json) writes it (with what the board kept).
  returned: always
  type: dict
"""
