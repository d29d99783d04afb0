"""``python -m bench.postgres``: zincir on PostgreSQL beside DBOS Transact, and beside zincir on SQLite
(issue 13). ``runner.py`` is the command, ``worker.py`` a worker process of comparison 4,
``report.py`` the Markdown and the chart.
"""
