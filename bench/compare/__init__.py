"""``python -m bench``: zincir side by side with DBOS Transact and LangGraph on SQLite (issue 9).

``runner.py`` is the command, ``comparisons.py`` the four comparisons (the first two reused by
``python -m bench.postgres``), ``report.py`` the Markdown.
"""
