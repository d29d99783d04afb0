-- zincir schema, version 6, for PostgreSQL: knowing what happened before recovering (see the
-- SQLite file).

ALTER TABLE tool_intents ADD COLUMN started BIGINT NOT NULL DEFAULT 0, ADD COLUMN last_started_at BIGINT;
ALTER TABLE agent_runs ADD COLUMN lease_host TEXT COLLATE "C", ADD COLUMN lease_pid BIGINT,
    ADD COLUMN lease_process_start BIGINT;

-- The leases held on each host: a claim looks for dead owners of its own host among these only.
CREATE INDEX idx_agent_runs_leased ON agent_runs (lease_host) WHERE lease_owner IS NOT NULL;
