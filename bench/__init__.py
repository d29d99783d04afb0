"""zincir's benchmarks: side by side with DBOS Transact and LangGraph, and of zincir alone.

``bench/README.md`` says what each one measures and how to run it. The layout:

* ``harness/``: what every study shares, once (child processes, the PostgreSQL server, the
  machine, charts, reports);
* ``systems/``: zincir, raw ``sqlite3``, DBOS and LangGraph behind one interface;
* one package per study, each with its runner and its report: ``compare/`` (``python -m bench``),
  ``postgres/``, ``signals/``, ``fanout/``, ``recovery/``, ``horizon/``, ``budget/``, ``floor/``,
  ``pg_op_cost/``;
* ``micro/``: micro-benchmarks and profiles of zincir alone;
* ``reports/``: the generated reports (never edited by hand).

The peers are imported lazily, only inside the child processes that host them, so the
zincir-only parts run without them.
"""
