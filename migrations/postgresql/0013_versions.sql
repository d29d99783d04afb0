-- zincir schema, version 13, for PostgreSQL: versions of an agent, in flight (see the SQLite
-- file and docs/versions.md).

ALTER TABLE agent_runs ADD COLUMN version TEXT COLLATE "C", ADD COLUMN fingerprints TEXT;

-- Its predicate names the statuses a run ends in, where idx_agent_runs_claimable's names the live
-- ones (the same runs): a claim of one version says it this way, so it implies this index's
-- predicate and not the other's, and PostgreSQL's planner (a generic plan too, which does not
-- know the version) reads this index's range of the version instead of walking every due run.
CREATE INDEX idx_agent_runs_version_claimable ON agent_runs (version, next_attempt_at, created_at)
    WHERE status NOT IN ('completed', 'failed', 'cancelled');
