-- zincir schema, version 5: budgets. Limits (NULL: none) and spend of a run, one row per run
-- that has a budget; the spend is debited in the transaction that records each response.

CREATE TABLE budgets (
    run_id                         TEXT PRIMARY KEY REFERENCES agent_runs (id) ON DELETE CASCADE,
    max_tokens                     INTEGER,
    max_input_tokens               INTEGER,
    max_output_tokens              INTEGER,
    max_cost                       REAL,
    max_model_calls                INTEGER,
    max_tool_calls                 INTEGER,
    -- Counted from the run's creation, across restarts.
    max_wall_time_ms               INTEGER,
    max_identical_tool_calls       INTEGER,
    max_responses_without_progress INTEGER,
    input_tokens                   INTEGER NOT NULL DEFAULT 0,
    output_tokens                  INTEGER NOT NULL DEFAULT 0,
    cost                           REAL NOT NULL DEFAULT 0,
    model_calls                    INTEGER NOT NULL DEFAULT 0,
    tool_calls                     INTEGER NOT NULL DEFAULT 0,
    -- The most calls of one tool with the same arguments (tool_call_counts), for loops.
    most_identical_tool_calls      INTEGER NOT NULL DEFAULT 0,
    -- Responses since the latest accepted checkpoint.
    responses_without_progress     INTEGER NOT NULL DEFAULT 0,
    updated_at                     INTEGER NOT NULL
) WITHOUT ROWID;

-- How often a budgeted run called each tool with the same arguments (args hash of the intent).
CREATE TABLE tool_call_counts (
    run_id    TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    args_hash TEXT NOT NULL,
    count     INTEGER NOT NULL,
    PRIMARY KEY (run_id, args_hash)
) WITHOUT ROWID;
