-- zincir schema, version 19: a prune batch finds its next runs by an index seek, however many
-- runs ended in the same millisecond.
--   idx_agent_runs_status_activity gains the run id, the tie-breaker of the order in which a
--   prune walks ended runs ((updated_at, id), docs/retention.md). Without it, every batch read
--   and sorted all the runs that ended at the cursor's instant to find the next few: runs
--   ended together (a bulk cancellation, a seeded benchmark) made a prune quadratic, 40 ms a
--   batch at 100,000 such runs on PostgreSQL. The index has as many entries as before, each
--   a run id longer.

DROP INDEX idx_agent_runs_status_activity;
CREATE INDEX idx_agent_runs_status_activity ON agent_runs (status, updated_at, id);
