-- zincir schema, version 15: deleting ended runs (zincir prune, docs/retention.md) finds what
-- refers to a run by an index, not by a scan of the whole table.
--   idx_joins_child    the joins that wait for a run (its parent's, or a fork's of a shared
--                      child): a prune reads them to keep families together, and deleting a
--                      run looks them up for the foreign key joins.child_id
--   idx_waits_signal   the wait that received a signal: deleting a signal looks it up for the
--                      foreign key waits.signal_id
-- Each costs a write only when a join is made or a signal wait completes.

CREATE INDEX idx_joins_child ON joins (child_id);
CREATE INDEX idx_waits_signal ON waits (signal_id) WHERE signal_id IS NOT NULL;
