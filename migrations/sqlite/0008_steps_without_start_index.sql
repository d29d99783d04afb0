-- zincir schema, version 8: a durable step writes one index fewer.
--   idx_steps_started is dropped. Every step paid a page of it in its commit (a third of the
--   pages a sequential step writes, about half of what a group commit of concurrent runs'
--   steps writes), and only the inspector's list of a run's steps read it. That list now sorts
--   the run's steps, found by the primary key (run_id, name): nothing for a run of a few
--   thousand steps, some milliseconds more for one of 100,000.

DROP INDEX IF EXISTS idx_steps_started;
