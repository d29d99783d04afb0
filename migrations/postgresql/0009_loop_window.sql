-- zincir schema, version 9, for PostgreSQL: loop detection counts within a window that an
-- accepted checkpoint resets (see the SQLite file).

ALTER TABLE budgets ADD COLUMN repeated_call_id TEXT;
DELETE FROM tool_call_counts;
UPDATE budgets SET most_identical_tool_calls = 0 WHERE most_identical_tool_calls <> 0;
