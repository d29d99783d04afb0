-- zincir schema, version 9, for PostgreSQL: a suspended run waits for several things at once,
-- and whichever comes first wakes it (see the SQLite file for the columns, and docs/waits.md).
-- A run suspended before this version gets its one wait as its set.

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
SELECT r.id, r.wait_kind, coalesce(r.wait_target, ''), coalesce(w.name, r.wait_target, ''),
       r.next_attempt_at, r.updated_at
FROM agent_runs AS r
LEFT JOIN waits AS w
       ON r.wait_kind = 'signal' AND w.run_id = r.id AND w.topic = r.wait_target AND w.completed_at IS NULL
WHERE r.status = 'waiting' AND r.wait_kind IS NOT NULL;
