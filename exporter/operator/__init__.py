"""Operator tools: the snapshot table, doctor (the version matrix and health checks)."""
