"""``python -m bench.streams``: durable streams' throughput, commits and live latency across
processes (issue 36). ``runner.py`` is the parent, ``zincir.py`` the writer and follower
processes, ``report.py`` the Markdown and the chart.
"""
