"""``python -m bench.prune``: how fast zincir.prune deletes ended runs, with a live writer (issue 37)."""
