"""edgeq.fleet.engine, run where Ansible runs: the board through the task's connection (edgeq.ansible)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.edgeq.fleet.plugins.module_utils.specs import ENGINE, ENGINE_RULES


class ActionModule(ActionBase):
    TRANSFERS_FILES = False  # its own transfers, into the board's content-addressed cache
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ENGINE, **ENGINE_RULES)
        try:
            from edgeq.ansible.plugin import run_action
        except ImportError as e:
            result.update(failed=True, msg=f"edgeq.fleet.engine needs edgeq in the Python that runs Ansible "
                          f"({e}): pip install 'edgeq[ansible]'")
            return result
        result.update(run_action("engine", self, args, task_vars or {}))
        return result
