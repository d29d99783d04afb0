"""``python -m bench.pg_op_cost``: one zincir-shaped PostgreSQL write's client CPU, four ways (issue 16)."""
