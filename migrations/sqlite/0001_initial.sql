-- zincir schema, version 1.
-- Conventions: run ids are canonical lowercase UUID strings; every timestamp and lease or
-- timer instant is an INTEGER of Unix epoch milliseconds; JSON columns are compact TEXT.

CREATE TABLE agent_runs (
    id               TEXT PRIMARY KEY,
    parent_run_id    TEXT REFERENCES agent_runs (id),
    role             TEXT NOT NULL,
    provider         TEXT NOT NULL,
    status           TEXT NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'running', 'completed', 'failed')),
    config           TEXT NOT NULL DEFAULT '{}',
    created_at       INTEGER NOT NULL,
    -- Last event or status change; heartbeats never touch it, so "recent activity" means progress.
    updated_at       INTEGER NOT NULL,
    -- Seq of the newest event (-1 before the first): allocation and the lease check are one UPDATE.
    last_seq         INTEGER NOT NULL DEFAULT -1,
    lease_owner      TEXT,
    lease_epoch      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    -- Resume-worker bookkeeping: claims so far, and when the run may be claimed again.
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  INTEGER NOT NULL DEFAULT 0,
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
);

-- A run's children in creation order (the inspector pages through them by keyset).
CREATE INDEX idx_agent_runs_parent ON agent_runs (parent_run_id, created_at, id)
    WHERE parent_run_id IS NOT NULL;
CREATE INDEX idx_agent_runs_claimable ON agent_runs (next_attempt_at, created_at)
    WHERE status IN ('pending', 'running');
CREATE INDEX idx_agent_runs_activity ON agent_runs (updated_at);
CREATE INDEX idx_agent_runs_status_activity ON agent_runs (status, updated_at);

-- The append-only, per-run log. Event types are checked by the code, not by a CHECK constraint,
-- so that a new event type never needs a table rebuild.
CREATE TABLE events (
    id              INTEGER PRIMARY KEY,
    run_id          TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    seq             INTEGER NOT NULL,
    type            TEXT NOT NULL,
    payload         TEXT NOT NULL,
    idempotency_key TEXT,
    created_at      INTEGER NOT NULL,
    UNIQUE (run_id, seq)
);

-- Tool events are kept unique by tool_intents (one row per call id, one result_seq), so only
-- the other keyed events need this index; every index here costs each append a page write.
CREATE UNIQUE INDEX idx_events_idempotency ON events (run_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND type NOT IN ('tool_call', 'tool_result');

-- One row per durable tool intent: a projection of the tool_call / tool_result events, written
-- in the same transaction, so that pending work is found in O(pending), not O(history).
CREATE TABLE tool_intents (
    run_id              TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    call_id             TEXT NOT NULL CHECK (length(call_id) >= 1),
    name                TEXT NOT NULL,
    intent_seq          INTEGER NOT NULL,
    response_seq        INTEGER NOT NULL,
    response_tool_count INTEGER NOT NULL,
    result_seq          INTEGER,
    PRIMARY KEY (run_id, call_id)
) WITHOUT ROWID;

CREATE INDEX idx_tool_intents_pending ON tool_intents (run_id, intent_seq)
    WHERE result_seq IS NULL;

CREATE TABLE checkpoints (
    id                 INTEGER PRIMARY KEY,
    run_id             TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    round              INTEGER NOT NULL,
    tool_call_id       TEXT NOT NULL,
    based_on_event_seq INTEGER NOT NULL,
    decision_event_seq INTEGER,
    status             TEXT NOT NULL CHECK (status IN ('candidate', 'accepted', 'rejected')),
    state              TEXT NOT NULL,
    verification       TEXT,
    created_at         INTEGER NOT NULL,
    decided_at         INTEGER,
    UNIQUE (run_id, round),
    UNIQUE (run_id, tool_call_id)
);

CREATE INDEX idx_checkpoints_status ON checkpoints (run_id, status, round);
-- At most one undecided candidate per run.
CREATE UNIQUE INDEX idx_checkpoints_one_candidate ON checkpoints (run_id)
    WHERE status = 'candidate';

CREATE TABLE steps (
    run_id       TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    name         TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    status       TEXT NOT NULL CHECK (status IN ('running', 'completed')),
    -- Lease epoch of the owner that claimed (and, once completed, finished) the step.
    epoch        INTEGER NOT NULL,
    result       TEXT,
    started_at   INTEGER NOT NULL,
    completed_at INTEGER,
    PRIMARY KEY (run_id, name)
);

-- A run's steps in start order, and its timers in wake order, without a sort.
CREATE INDEX idx_steps_started ON steps (run_id, started_at, name);

CREATE TABLE timers (
    run_id       TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    name         TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    wake_at      INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    completed_at INTEGER,
    PRIMARY KEY (run_id, name)
);

CREATE INDEX idx_timers_wake ON timers (run_id, wake_at, name);

-- Reserved for signals between runs.
CREATE TABLE messages (
    id          INTEGER PRIMARY KEY,
    from_run_id TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    to_run_id   TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    payload     TEXT NOT NULL,
    delivered   INTEGER NOT NULL DEFAULT 0 CHECK (delivered IN (0, 1)),
    created_at  INTEGER NOT NULL
);

CREATE INDEX idx_messages_undelivered ON messages (to_run_id) WHERE delivered = 0;
