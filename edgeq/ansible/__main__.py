"""``python -m edgeq.ansible``: the directory ANSIBLE_COLLECTIONS_PATH takes for the edgeq.fleet modules."""

from edgeq.ansible import COLLECTIONS_PATH

print(COLLECTIONS_PATH)
