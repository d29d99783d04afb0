-- zincir schema, version 5, for PostgreSQL: budgets (see the SQLite file).

CREATE TABLE budgets (
    run_id                         TEXT COLLATE "C" PRIMARY KEY REFERENCES agent_runs (id) ON DELETE CASCADE,
    max_tokens                     BIGINT,
    max_input_tokens               BIGINT,
    max_output_tokens              BIGINT,
    max_cost                       DOUBLE PRECISION,
    max_model_calls                BIGINT,
    max_tool_calls                 BIGINT,
    max_wall_time_ms               BIGINT,
    max_identical_tool_calls       BIGINT,
    max_responses_without_progress BIGINT,
    input_tokens                   BIGINT NOT NULL DEFAULT 0,
    output_tokens                  BIGINT NOT NULL DEFAULT 0,
    cost                           DOUBLE PRECISION NOT NULL DEFAULT 0,
    model_calls                    BIGINT NOT NULL DEFAULT 0,
    tool_calls                     BIGINT NOT NULL DEFAULT 0,
    most_identical_tool_calls      BIGINT NOT NULL DEFAULT 0,
    responses_without_progress     BIGINT NOT NULL DEFAULT 0,
    updated_at                     BIGINT NOT NULL
);

CREATE TABLE tool_call_counts (
    run_id    TEXT COLLATE "C" NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    args_hash TEXT COLLATE "C" NOT NULL,
    count     BIGINT NOT NULL,
    PRIMARY KEY (run_id, args_hash)
);
