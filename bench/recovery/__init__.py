"""``python -m bench.recovery``: duplicated effects and recovery time after a SIGKILL (issue 18).
``runner.py`` is the parent, ``ledger.py`` the tool's ledger, one module per system for its child
processes (``zincir.py``, ``dbos.py``, ``langgraph.py``), ``report.py`` the Markdown and the chart.
"""
