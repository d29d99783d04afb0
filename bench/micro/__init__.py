"""Micro-benchmarks of zincir alone, each one module run with ``python -m bench.micro.NAME``:
``profile_step`` (a sequential step leg by leg, with ``legs.py``), ``profile_pg`` (zincir's
statements on PostgreSQL), ``store`` (durable appends and reads), ``worker`` (a resume worker's
claims) and ``inspector`` (the inspector's latency).
"""
