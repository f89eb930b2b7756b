"""Targets, SSH transport and the on-target agent. Only the transport's layers (``ssh``, ``hostkeys``,
``exec``, ``upload``; composed by ``transport``) import paramiko."""
