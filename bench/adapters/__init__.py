"""``python -m bench.adapters``: what zincir.adapters add to ``record_response`` (issue 38)."""
