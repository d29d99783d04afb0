-- zincir schema, version 11, for PostgreSQL: forks (see the SQLite file).

ALTER TABLE agent_runs ADD COLUMN forked_from TEXT COLLATE "C", ADD COLUMN fork_seq BIGINT;
ALTER TABLE tool_intents ADD COLUMN effect_run_id TEXT COLLATE "C";

CREATE INDEX idx_agent_runs_forks ON agent_runs (forked_from, created_at, id)
    WHERE forked_from IS NOT NULL;

CREATE TABLE shared_children (
    run_id     TEXT COLLATE "C" NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    spawn_name TEXT COLLATE "C" NOT NULL,
    child_id   TEXT COLLATE "C" NOT NULL REFERENCES agent_runs (id),
    PRIMARY KEY (run_id, spawn_name)
);

CREATE INDEX idx_shared_children_child ON shared_children (child_id);
