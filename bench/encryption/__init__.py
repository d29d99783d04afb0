"""Encryption at rest: what it costs a step (issue 37)."""
