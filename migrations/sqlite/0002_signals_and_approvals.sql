-- zincir schema, version 2: signals and approvals (inboxes that outsiders write without a lease)
-- and named waits (what a run awaits, written only by its lease holder).

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

-- Approvals of tool intents: the owner writes the request (bound to the intent's args hash),
-- an outsider writes the decision without a lease, and the owner logs it. Never deleted.
CREATE TABLE approvals (
    run_id       TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    call_id      TEXT NOT NULL,
    tool_name    TEXT NOT NULL,
    -- SHA-256 of the canonical JSON of the intent's name and args, as recorded.
    args_hash    TEXT NOT NULL,
    requested_at INTEGER NOT NULL,
    deadline     INTEGER,
    approved     INTEGER CHECK (approved IN (0, 1)),
    decided_by   TEXT,
    reason       TEXT,
    decided_at   INTEGER,
    timed_out    INTEGER NOT NULL DEFAULT 0 CHECK (timed_out IN (0, 1)),
    -- When the owner entered the decision in the log (approval_decided).
    logged_at    INTEGER,
    PRIMARY KEY (run_id, call_id),
    CHECK ((approved IS NULL) = (decided_at IS NULL))
);

-- Open requests, oldest first (zincir approvals).
CREATE INDEX idx_approvals_open ON approvals (requested_at, run_id) WHERE decided_at IS NULL AND timed_out = 0;
