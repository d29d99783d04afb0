"""``python -m bench.forks``: what a fork costs as the log it copies grows (issue 33)."""
