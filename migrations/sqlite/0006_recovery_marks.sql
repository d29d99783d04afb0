-- zincir schema, version 6: knowing what happened before recovering.
--   tool_intents.started / last_started_at  how often a tool call was started (run.start_tool),
--                                           and when last: 0 means it never began
--   agent_runs.lease_host / lease_pid / lease_process_start
--                                           who holds the lease: the host (boot id and PID
--                                           namespace), the process and its start time, so that
--                                           the same host can tell a dead owner from a live one

ALTER TABLE tool_intents ADD COLUMN started INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tool_intents ADD COLUMN last_started_at INTEGER;
ALTER TABLE agent_runs ADD COLUMN lease_host TEXT;
ALTER TABLE agent_runs ADD COLUMN lease_pid INTEGER;
ALTER TABLE agent_runs ADD COLUMN lease_process_start INTEGER;

-- The leases held on each host: a claim looks for dead owners of its own host among these only.
CREATE INDEX idx_agent_runs_leased ON agent_runs (lease_host) WHERE lease_owner IS NOT NULL;
