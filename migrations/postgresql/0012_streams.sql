-- zincir schema, version 12, for PostgreSQL: durable streams (see the SQLite file for the
-- columns, and docs/streams.md).

CREATE TABLE streams (
    run_id       TEXT COLLATE "C" NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    name         TEXT COLLATE "C" NOT NULL,
    attempt      INTEGER NOT NULL CHECK (attempt >= 1),
    epoch        BIGINT NOT NULL,
    first_offset BIGINT NOT NULL,
    next_offset  BIGINT NOT NULL,
    state        TEXT COLLATE "C" NOT NULL CHECK (state IN ('open', 'closed', 'interrupted')),
    last_flush   TEXT COLLATE "C" NOT NULL,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (run_id, name, attempt),
    CHECK (next_offset > first_offset)
);

CREATE TABLE stream_chunks (
    run_id       TEXT COLLATE "C" NOT NULL,
    name         TEXT COLLATE "C" NOT NULL,
    chunk_offset BIGINT NOT NULL,
    attempt      INTEGER NOT NULL,
    data         TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (run_id, name, chunk_offset),
    FOREIGN KEY (run_id, name, attempt) REFERENCES streams (run_id, name, attempt) ON DELETE CASCADE
);
