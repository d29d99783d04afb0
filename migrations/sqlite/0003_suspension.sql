-- zincir schema, version 3: suspended runs. A run whose handler waits longer than its worker's
-- suspend_after gives its lease up and sleeps in the database as status 'waiting':
--   next_attempt_at  when it becomes due by itself (a wait's deadline, a sleep's wake time);
--                    NULL now means never by itself: only an outsider's write makes it due
--   wait_kind        what it waits for: 'signal', 'approval', 'sleep'
--   wait_target      the signal topic, the tool call id or the sleep name it waits on; a send or
--                    a decision that matches makes the run due at once
-- 'cancelled' is accepted already so that child runs need no second rebuild of this table.
--
-- SQLite cannot change a CHECK constraint in place: the table is rebuilt (zincir applies
-- migrations with foreign keys off and checks them before it commits).

CREATE TABLE agent_runs_v3 (
    id               TEXT PRIMARY KEY,
    parent_run_id    TEXT REFERENCES agent_runs (id),
    role             TEXT NOT NULL,
    provider         TEXT NOT NULL,
    status           TEXT NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'running', 'waiting', 'completed', 'failed', 'cancelled')),
    config           TEXT NOT NULL DEFAULT '{}',
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    last_seq         INTEGER NOT NULL DEFAULT -1,
    lease_owner      TEXT,
    lease_epoch      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  INTEGER DEFAULT 0,
    wait_kind        TEXT,
    wait_target      TEXT,
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CHECK ((status = 'waiting') = (wait_kind IS NOT NULL)),
    CHECK (status <> 'waiting' OR lease_owner IS NULL)
);

INSERT INTO agent_runs_v3 (id, parent_run_id, role, provider, status, config, created_at, updated_at,
                           last_seq, lease_owner, lease_epoch, lease_expires_at, attempts, next_attempt_at)
SELECT id, parent_run_id, role, provider, status, config, created_at, updated_at,
       last_seq, lease_owner, lease_epoch, lease_expires_at, attempts, next_attempt_at
FROM agent_runs;

DROP TABLE agent_runs;
ALTER TABLE agent_runs_v3 RENAME TO agent_runs;

CREATE INDEX idx_agent_runs_parent ON agent_runs (parent_run_id, created_at, id)
    WHERE parent_run_id IS NOT NULL;
-- Suspended runs are in it too: one range scan finds whatever is due, deadlines included.
CREATE INDEX idx_agent_runs_claimable ON agent_runs (next_attempt_at, created_at)
    WHERE status IN ('pending', 'running', 'waiting');
CREATE INDEX idx_agent_runs_activity ON agent_runs (updated_at);
CREATE INDEX idx_agent_runs_status_activity ON agent_runs (status, updated_at);
