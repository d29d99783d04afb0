-- zincir schema, version 13: versions of an agent, in flight (docs/versions.md).
--   agent_runs.version       the version of the code a run belongs to (NULL: none). A worker
--                            serving some versions claims only their runs
--   agent_runs.fingerprints  what shaped the run ({"prompt": "<sha>", ...}, compact JSON), or NULL
-- A worker of one version claims through idx_agent_runs_version_claimable: its version's due
-- runs, most overdue first, one index range, however many due runs other versions have.

ALTER TABLE agent_runs ADD COLUMN version TEXT;
ALTER TABLE agent_runs ADD COLUMN fingerprints TEXT;

-- Its predicate names the statuses a run ends in, where idx_agent_runs_claimable's names the live
-- ones (the same runs): a claim of one version says it this way, so it implies this index's
-- predicate and not the other's, and PostgreSQL's planner (a generic plan too, which does not
-- know the version) reads this index's range of the version instead of walking every due run.
CREATE INDEX idx_agent_runs_version_claimable ON agent_runs (version, next_attempt_at, created_at)
    WHERE status NOT IN ('completed', 'failed', 'cancelled');
