-- zincir schema, version 10, for PostgreSQL: loop detection counts within a window that an
-- accepted checkpoint resets (see the SQLite file).

ALTER TABLE budgets ADD COLUMN repeated_call_id TEXT;
DELETE FROM tool_call_counts;
UPDATE budgets SET most_identical_tool_calls = 0 WHERE most_identical_tool_calls <> 0;

-- Who waits for a run to end (zincir.wait_for_end), so that ending a run sends a notification
-- only when somebody listens for it: a transaction that notifies commits in turn with every
-- other notifying one, which ending each run unconditionally would impose on every worker.
-- A waiter's row goes when it stops waiting, and every row of a run when the run ends.
CREATE TABLE run_waiters (
    run_id     TEXT COLLATE "C" NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    waiter     TEXT COLLATE "C" NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, waiter)
);
