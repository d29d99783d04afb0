-- zincir schema, version 4: child runs and cancellation.
--   result               the JSON a run completed with (complete(result=...)), for its parent
--   spawn_name           the name its parent spawned it under: unique per parent, so a spawn
--                        repeated after a crash finds the child instead of making another
--   cancel_requested_at  an outsider asked for cancellation (cancel_run): the owner's heartbeat
--   cancel_reason        sees it and ends the run 'cancelled'; an unowned run is ended at once.
--                        The time is cleared when the run ends (its transition keeps the reason),
--                        so that the index below holds only requests not yet acted on.

ALTER TABLE agent_runs ADD COLUMN result TEXT;
ALTER TABLE agent_runs ADD COLUMN spawn_name TEXT;
ALTER TABLE agent_runs ADD COLUMN cancel_requested_at INTEGER;
ALTER TABLE agent_runs ADD COLUMN cancel_reason TEXT;

CREATE UNIQUE INDEX idx_agent_runs_spawned ON agent_runs (parent_run_id, spawn_name)
    WHERE spawn_name IS NOT NULL;
-- Requests not yet acted on (a watcher of the file finds new ones without a scan).
CREATE INDEX idx_agent_runs_cancel ON agent_runs (cancel_requested_at)
    WHERE cancel_requested_at IS NOT NULL;

-- A parent's joins: what it waits for (a child to end), until when; written by the parent's owner.
CREATE TABLE joins (
    run_id       TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    child_id     TEXT NOT NULL REFERENCES agent_runs (id),
    deadline     INTEGER,
    created_at   INTEGER NOT NULL,
    completed_at INTEGER,
    timed_out    INTEGER NOT NULL DEFAULT 0 CHECK (timed_out IN (0, 1)),
    PRIMARY KEY (run_id, child_id)
);

CREATE INDEX idx_joins_open ON joins (run_id, created_at) WHERE completed_at IS NULL;
