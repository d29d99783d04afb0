"""The systems the main comparison measures side by side: zincir, raw ``sqlite3`` (the floor and
the ceiling), DBOS Transact and LangGraph, each behind the same methods, each hosted in a child
process of its own (``host.py``). ``python -m bench.postgres`` and ``python -m bench.floor`` reuse
them. A peer's package is imported only in the child that hosts it.
"""
