-- zincir schema, version 2: signals (an inbox that outsiders write without a lease) and named
-- waits (what a run awaits, written only by its lease holder).

CREATE TABLE signals (
    id          INTEGER PRIMARY KEY,
    run_id      TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    topic       TEXT NOT NULL CHECK (length(topic) BETWEEN 1 AND 255),
    payload     TEXT NOT NULL,
    -- The sender's idempotency key: a second send with the same key stores nothing.
    key         TEXT,
    created_at  INTEGER NOT NULL,
    -- The wait that received it (first write wins), and when.
    consumed_by TEXT,
    consumed_at INTEGER
);

CREATE UNIQUE INDEX idx_signals_key ON signals (run_id, key) WHERE key IS NOT NULL;
-- The oldest unconsumed signal of a topic, without a scan.
CREATE INDEX idx_signals_unconsumed ON signals (run_id, topic, id) WHERE consumed_by IS NULL;

CREATE TABLE waits (
    run_id       TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    name         TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    kind         TEXT NOT NULL CHECK (kind IN ('signal')),
    topic        TEXT NOT NULL,
    -- Absolute, stored on the first call; NULL waits for ever.
    deadline     INTEGER,
    created_at   INTEGER NOT NULL,
    completed_at INTEGER,
    signal_id    INTEGER REFERENCES signals (id),
    timed_out    INTEGER NOT NULL DEFAULT 0 CHECK (timed_out IN (0, 1)),
    PRIMARY KEY (run_id, name)
);

-- The open waits of a run (the inspector and CLI show them).
CREATE INDEX idx_waits_open ON waits (run_id, created_at) WHERE completed_at IS NULL;
