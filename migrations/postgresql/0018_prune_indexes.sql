-- zincir schema, version 18: deleting ended runs (zincir prune, docs/retention.md) finds what
-- refers to a run by an index, not by a scan of a whole table. Deleting a row of agent_runs or
-- signals looks up, for each foreign key that refers to it, the rows that still do; a partial
-- index cannot serve that lookup, so these are whole ones.
--   idx_signals_run         a run's signals (idx_signals_key and idx_signals_unconsumed are
--                           partial): without it, deleting a run read every signal
--   idx_joins_child         the joins that wait for a run (its parent's, or a fork's of a shared
--                           child); a prune also reads them to keep families together
--   idx_waits_signal        the wait that received a signal
--   idx_messages_from, idx_messages_to
--                           the reserved table of messages between runs, which two keys tie to
--                           agent_runs
-- Each costs a write only when a signal is sent, a join made or a signal wait completed.

CREATE INDEX idx_signals_run ON signals (run_id);
CREATE INDEX idx_joins_child ON joins (child_id);
CREATE INDEX idx_waits_signal ON waits (signal_id);
CREATE INDEX idx_messages_from ON messages (from_run_id);
CREATE INDEX idx_messages_to ON messages (to_run_id);
