-- zincir schema, version 20: the look for dead lease holders of this host, made at every claim,
-- reads the leases held and nothing else.
--   idx_agent_runs_leased keeps only running runs with a lease (the two queries that read it,
--   docs/crashes.md, ask for no others) and gains the holder's process, which the second of
--   them looks up. On PostgreSQL the old index, keyed by the host alone, was read as a bitmap
--   and ANDed with the status index: every claim then visited each row version a claim or an
--   end had left behind since the last vacuum, 0.7 ms a claim after 3,000 runs. A plain index
--   scan marks such entries dead as it passes them (docs/performance.md).

DROP INDEX idx_agent_runs_leased;
CREATE INDEX idx_agent_runs_leased ON agent_runs (lease_host, lease_pid, lease_process_start)
    WHERE lease_owner IS NOT NULL AND status = 'running';
