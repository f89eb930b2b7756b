"""edgeq.fleet.preload: edgeq imported once in ansible-playbook, before it forks a worker a board."""

from __future__ import annotations

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
---
name: preload
type: aggregate
short_description: Import edgeq once, before Ansible forks a worker for each board
description:
  - Ansible runs each board's task in a worker process forked from ansible-playbook; without this plugin each
    worker imports edgeq (its report, gate and ONNX code) for its one task, about a second of CPU a board.
    Enabled, ansible-playbook imports it once and every worker starts with it.
  - Prints nothing; C(edgeq fleet validate --engine ansible) and C(edgeq release install --engine ansible)
    enable it themselves.
version_added: 1.0.0
author:
  - edgeq maintainers
requirements:
  - edgeq, in the Python that runs Ansible
notes:
  - Enable it with C(callbacks_enabled = edgeq.fleet.preload) in ansible.cfg or
    C(ANSIBLE_CALLBACKS_ENABLED=edgeq.fleet.preload).
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "edgeq.fleet.preload"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        try:
            from edgeq.ansible.plugin import preload
        except ImportError:  # the modules say so, task by task
            return
        preload()
