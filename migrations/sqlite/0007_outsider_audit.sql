-- zincir schema, version 7: an audit trail of outsiders' writes.
--   outsider_actions  one row per write an outsider made (a signal sent, an approval decided, a
--                     run cancelled or retried now, a budget raised), in the same transaction as
--                     the write itself, naming who made it. Written only by zincir's outsider
--                     functions (never by the run's owner), and never changed or deleted.

CREATE TABLE outsider_actions (
    id         INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    -- What was done: signal, approve, deny, cancel, retry_now, raise_budget.
    action     TEXT NOT NULL CHECK (length(action) BETWEEN 1 AND 64),
    -- Who did it, as the caller named them (NULL: nobody was named).
    done_by    TEXT,
    -- A JSON object with what the write needed to say (the signal's id, the reason, the limits).
    detail     TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

-- A run's trail, in order.
CREATE INDEX idx_outsider_actions_run ON outsider_actions (run_id, id);
