"""``python -m bench.fanout``: fan-out/fan-in of child runs, zincir vs DBOS child workflows (issue 16).
``runner.py`` is the parent, ``zincir.py`` and ``dbos.py`` each system's process, ``report.py``
the Markdown and the chart.
"""
