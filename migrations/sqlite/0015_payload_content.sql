-- zincir schema, version 15: large JSON values stored once (docs/payloads.md).
--   payload_content  a part of a JSON value column's text (an event payload's large member, a
--                    large step result or config) stored once, by the SHA-256 of its text
--   payload_refs     which runs' columns use each part: one row per (run, part), gone with the
--                    run (ON DELETE CASCADE), so a part no row names any more is garbage that a
--                    sweep (prune) deletes. A new run's config is referenced once its row
--                    exists (a spawn repeated after a restart writes no row).
-- A column that uses parts holds a reference text, '@' and the parts' list: no JSON text
-- starts with '@', so the values written before this version read as they are.

CREATE TABLE payload_content (
    digest     TEXT PRIMARY KEY,
    body       TEXT NOT NULL,
    size       INTEGER NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE payload_refs (
    run_id TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    digest TEXT NOT NULL,
    PRIMARY KEY (run_id, digest)
) WITHOUT ROWID;

-- Whether any run still refers to a part (the sweep), without a scan.
CREATE INDEX idx_payload_refs_digest ON payload_refs (digest);
