-- zincir schema, version 9: a suspended run waits for several things at once, and whichever
-- comes first wakes it (docs/waits.md).
--   run_waits   one row for each wait the run was suspended on; while the run is 'waiting', an
--               outsider's write that matches any row makes it due at once
--     kind      'signal', 'approval', 'child', 'sleep' or 'budget'
--     wake_key  what such a write matches: the signal's topic, the tool call id, the child
--               run's id, the sleep's name, '' for a budget raised
--     name      the wait itself: the signal wait's name, the call id, the child's id, the
--               sleep's name, the budget limit reached
--     deadline  its deadline or wake time (NULL: none); the run's next_attempt_at is the
--               earliest of them
--   A suspension replaces the run's rows; they mean nothing once the run runs again.
--   agent_runs.wait_kind and wait_target keep the wait whose suspension began it (the first).
-- A run suspended before this version gets its one wait as its set (a signal's by the open
-- waits on its topic).

CREATE TABLE run_waits (
    run_id     TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    kind       TEXT NOT NULL CHECK (kind IN ('signal', 'approval', 'child', 'sleep', 'budget')),
    wake_key   TEXT NOT NULL,
    name       TEXT NOT NULL,
    deadline   INTEGER,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, kind, wake_key, name)
) WITHOUT ROWID;

INSERT INTO run_waits (run_id, kind, wake_key, name, deadline, created_at)
SELECT r.id, r.wait_kind, coalesce(r.wait_target, ''), coalesce(w.name, r.wait_target, ''),
       r.next_attempt_at, r.updated_at
FROM agent_runs AS r
LEFT JOIN waits AS w
       ON r.wait_kind = 'signal' AND w.run_id = r.id AND w.topic = r.wait_target AND w.completed_at IS NULL
WHERE r.status = 'waiting' AND r.wait_kind IS NOT NULL;
