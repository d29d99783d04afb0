-- zincir schema, version 10: loop detection counts within a window; waiting for a run to end.
--   tool_call_counts  now counts each (tool, arguments) since the run's latest accepted
--                     checkpoint: accepting one empties the run's rows
--   budgets.most_identical_tool_calls
--                     now the count of the most repeated call of the latest response (0 after
--                     an accepted checkpoint and after a response without tool calls), no longer
--                     the highest count ever: a response that repeats nothing is no loop
--   budgets.repeated_call_id
--                     that call's id, when it was made more than once
-- The counts of runs already under way start again here: the old ones spanned whole runs.

ALTER TABLE budgets ADD COLUMN repeated_call_id TEXT;
DELETE FROM tool_call_counts;
UPDATE budgets SET most_identical_tool_calls = 0 WHERE most_identical_tool_calls <> 0;

-- zincir.wait_for_end() needs no table here: each waiting process's watcher looks at the runs
-- it waits for whenever the file changes (see the PostgreSQL file for why that one has one).
