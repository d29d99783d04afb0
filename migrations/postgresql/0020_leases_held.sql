-- zincir schema, version 20, for PostgreSQL: the look for dead lease holders of this host reads
-- the leases held and nothing else (see the SQLite file).

DROP INDEX idx_agent_runs_leased;
CREATE INDEX idx_agent_runs_leased ON agent_runs (lease_host, lease_pid, lease_process_start)
    WHERE lease_owner IS NOT NULL AND status = 'running';
