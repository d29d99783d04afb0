"""``python -m bench.floor``: how close any Trio group commit gets to SQLite's batched ceiling
(issue 14).
"""
