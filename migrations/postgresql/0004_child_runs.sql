-- zincir schema, version 4, for PostgreSQL: child runs and cancellation (see the SQLite file).

ALTER TABLE agent_runs ADD COLUMN result TEXT;
ALTER TABLE agent_runs ADD COLUMN spawn_name TEXT COLLATE "C";
ALTER TABLE agent_runs ADD COLUMN cancel_requested_at BIGINT;
ALTER TABLE agent_runs ADD COLUMN cancel_reason TEXT;

CREATE UNIQUE INDEX idx_agent_runs_spawned ON agent_runs (parent_run_id, spawn_name)
    WHERE spawn_name IS NOT NULL;
CREATE INDEX idx_agent_runs_cancel ON agent_runs (cancel_requested_at)
    WHERE cancel_requested_at IS NOT NULL;

CREATE TABLE joins (
    run_id       TEXT COLLATE "C" NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    child_id     TEXT COLLATE "C" NOT NULL REFERENCES agent_runs (id),
    deadline     BIGINT,
    created_at   BIGINT NOT NULL,
    completed_at BIGINT,
    timed_out    BIGINT NOT NULL DEFAULT 0 CHECK (timed_out IN (0, 1)),
    PRIMARY KEY (run_id, child_id)
);

CREATE INDEX idx_joins_open ON joins (run_id, created_at) WHERE completed_at IS NULL;
