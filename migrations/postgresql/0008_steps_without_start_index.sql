-- zincir schema, version 8, for PostgreSQL: a durable step writes one index fewer (see the
-- SQLite file); a run's steps are listed by sorting the ones its primary key finds.

DROP INDEX IF EXISTS idx_steps_started;
