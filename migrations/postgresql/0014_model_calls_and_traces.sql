-- zincir schema, version 14, for PostgreSQL: model calls in flight, and the trace a run
-- belongs to (see the SQLite file).

ALTER TABLE agent_runs ADD COLUMN model_call_seq BIGINT, ADD COLUMN traceparent TEXT COLLATE "C";
