"""``python -m bench.budget``: what a budget's debit costs ``record_response`` (issue 17)."""
