"""Targets, SSH transport and the on-target agent. Only ``ssh``, ``exec`` and ``upload`` (composed by
``transport``) import paramiko."""
