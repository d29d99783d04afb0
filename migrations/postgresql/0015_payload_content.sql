-- zincir schema, version 15, for PostgreSQL: large JSON values stored once (see the SQLite
-- file, and docs/payloads.md). A sweep and the writers that add references are kept apart by
-- an advisory lock (zincir._sql.Dialect.content_guard), not by these tables' row locks.

CREATE TABLE payload_content (
    digest     TEXT COLLATE "C" PRIMARY KEY,
    body       TEXT NOT NULL,
    size       BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE payload_refs (
    run_id TEXT COLLATE "C" NOT NULL
           REFERENCES agent_runs (id) ON DELETE CASCADE,
    digest TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (run_id, digest)
);

CREATE INDEX idx_payload_refs_digest ON payload_refs (digest);
