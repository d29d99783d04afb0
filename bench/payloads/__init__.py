"""``python -m bench.payloads``: the content store, bytes on disk and the cost of a small step (issue 37)."""
