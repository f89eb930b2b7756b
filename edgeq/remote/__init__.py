"""Targets, SSH transport and the on-target agent. Only ``transport`` imports paramiko."""
