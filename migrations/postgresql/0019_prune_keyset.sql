-- zincir schema, version 19, for PostgreSQL: idx_agent_runs_status_activity gains the run id,
-- so a prune batch finds its next runs by an index seek however many ended in the same
-- millisecond (see the SQLite file).

DROP INDEX idx_agent_runs_status_activity;
CREATE INDEX idx_agent_runs_status_activity ON agent_runs (status, updated_at, id);
