-- zincir schema, version 11, for PostgreSQL: versions of an agent, in flight (see the SQLite
-- file and docs/versions.md).

ALTER TABLE agent_runs ADD COLUMN version TEXT COLLATE "C", ADD COLUMN fingerprints TEXT;

CREATE INDEX idx_agent_runs_version_claimable ON agent_runs (version, next_attempt_at, created_at)
    WHERE status IN ('pending', 'running', 'waiting');
