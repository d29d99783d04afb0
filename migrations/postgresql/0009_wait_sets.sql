-- zincir schema, version 9, for PostgreSQL: a suspended run waits for several things at once,
-- and whichever comes first wakes it (see the SQLite file for the columns, and docs/waits.md).

CREATE TABLE run_waits (
    run_id     TEXT COLLATE "C" NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    kind       TEXT COLLATE "C" NOT NULL CHECK (kind IN ('signal', 'approval', 'child', 'sleep', 'budget')),
    wake_key   TEXT COLLATE "C" NOT NULL,
    name       TEXT COLLATE "C" NOT NULL,
    deadline   BIGINT,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, kind, wake_key, name)
);

INSERT INTO run_waits (run_id, kind, wake_key, name, deadline, created_at)
SELECT id, wait_kind, coalesce(wait_target, ''), coalesce(wait_target, ''), next_attempt_at, updated_at
FROM agent_runs WHERE status = 'waiting' AND wait_kind IS NOT NULL;
