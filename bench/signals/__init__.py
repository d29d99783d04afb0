"""``python -m bench.signals``: how fast a signal sent by one process wakes a run waiting in another
(issue 15). ``runner.py`` is the parent, one module per system hosts the waiting and the sending
side (``zincir.py``, ``dbos.py``, ``langgraph.py``), ``report.py`` the Markdown and the chart.
"""
