"""Side-by-side benchmarks of zincir against DBOS Transact (SQLite) and LangGraph (SqliteSaver).

Run ``python -m bench`` (see ``bench/README.md``). The peers are imported lazily, only inside
the child processes that host them, so the zincir-only parts run without them.
"""
