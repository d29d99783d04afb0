"""``python -m bench.horizon``: a long-horizon agent under SIGKILLs, three dimensions (issue 20).
``runner.py`` is the parent (trials, kills, the checker), ``agent.py`` the agent's process and
its scripted model, ``report.py`` the Markdown and the chart.
"""
