"""Fleets on Ansible: the ``edgeq.fleet`` collection shipped in this package, and ``--engine ansible``.

The collection (``ansible_collections/edgeq/fleet/`` beside this file) holds three modules, ``facts``,
``engine`` and ``release``, each an action plugin: it runs on the machine running Ansible, reaches the
board through Ansible's own connection (``edgeq.ansible.connection``: the ``Runner`` seam the stages
already use) and calls edgeq's agent there, as ``deploy`` and ``fleet validate`` do. So a playbook task
and ``edgeq fleet validate`` run the same stages, write the same run directories and give the same
verdicts. ``edgeq.ansible.engine`` is ``fleet validate`` / ``release install`` run through
ansible-runner over a fleet.

Nothing here imports Ansible at module level: ``edgeq --help`` and the native engine never need it
(``pip install 'edgeq[ansible]'`` brings it).
"""

from __future__ import annotations

from pathlib import Path

from edgeq.errors import EdgeqError

COLLECTION = "edgeq.fleet"
# What ANSIBLE_COLLECTIONS_PATH names: the directory holding ``ansible_collections/``.
COLLECTIONS_PATH = Path(__file__).resolve().parent
COLLECTION_DIR = COLLECTIONS_PATH / "ansible_collections" / "edgeq" / "fleet"
INSTALL_HINT = "install edgeq's Ansible extra: pip install 'edgeq[ansible]' (ansible-core and ansible-runner)"


def require_ansible() -> None:
    """ansible-core and ansible-runner importable, or one clear line saying how to get them."""
    import importlib.util

    packages = {"ansible": "ansible-core", "ansible_runner": "ansible-runner"}
    missing = [p for m, p in packages.items() if importlib.util.find_spec(m) is None]
    if missing:
        which = " and ".join(missing) + (", which are" if len(missing) > 1 else ", which is")
        raise EdgeqError(f"--engine ansible needs {which} not installed in this Python", INSTALL_HINT)
