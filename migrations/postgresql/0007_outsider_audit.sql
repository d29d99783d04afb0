-- zincir schema, version 7, for PostgreSQL: an audit trail of outsiders' writes (see the SQLite
-- file).

CREATE TABLE outsider_actions (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id     TEXT COLLATE "C" NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    action     TEXT COLLATE "C" NOT NULL CHECK (length(action) BETWEEN 1 AND 64),
    done_by    TEXT,
    detail     TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE INDEX idx_outsider_actions_run ON outsider_actions (run_id, id);
