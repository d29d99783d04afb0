-- zincir schema, version 3, for PostgreSQL: suspended runs. A run whose handler waits longer
-- than its worker's suspend_after gives its lease up and sleeps in the database as 'waiting':
--   next_attempt_at  when it becomes due by itself (a wait's deadline, a sleep's wake time);
--                    NULL now means never by itself: only an outsider's write makes it due
--   wait_kind        what it waits for: 'signal', 'approval', 'sleep'
--   wait_target      the signal topic, the tool call id or the sleep name it waits on; a send or
--                    a decision that matches makes the run due at once
-- 'cancelled' is accepted already, as on SQLite (where each change of the CHECK is a rebuild).

ALTER TABLE agent_runs DROP CONSTRAINT agent_runs_status_check;
ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_status_check
    CHECK (status IN ('pending', 'running', 'waiting', 'completed', 'failed', 'cancelled'));
ALTER TABLE agent_runs ALTER COLUMN next_attempt_at DROP NOT NULL;
ALTER TABLE agent_runs ADD COLUMN wait_kind TEXT COLLATE "C", ADD COLUMN wait_target TEXT COLLATE "C";
ALTER TABLE agent_runs ADD CONSTRAINT agent_runs_waiting_check
    CHECK ((status = 'waiting') = (wait_kind IS NOT NULL) AND (status <> 'waiting' OR lease_owner IS NULL));

DROP INDEX idx_agent_runs_claimable;
-- Suspended runs are in it too: one range scan finds whatever is due, deadlines included.
CREATE INDEX idx_agent_runs_claimable ON agent_runs (next_attempt_at, created_at)
    WHERE status IN ('pending', 'running', 'waiting');
