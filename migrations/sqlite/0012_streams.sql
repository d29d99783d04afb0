-- zincir schema, version 12: durable streams (docs/streams.md).
--   streams        one row per attempt of a named stream of a run: a writer of a new lease
--                  epoch starts the next attempt (attempt + 1) where the last one's offsets
--                  ended, and marks that one interrupted if its writer never closed it.
--     epoch        the lease epoch whose owner wrote the attempt
--     first_offset the offset of the attempt's first chunk; chunks first_offset..next_offset-1
--                  are the attempt's (every attempt has at least one: it starts with its
--                  first flush)
--     state        open (a writer may still flush), closed (its writer exited), interrupted
--                  (a later attempt began while it was open)
--     last_flush   the token of the last flush stored, so that a flush retried after an
--                  unknown outcome is stored once
--   stream_chunks  the chunks: JSON values at gap-free offsets per (run, stream name), across
--                  the stream's attempts.
-- Both go with their run (ON DELETE CASCADE).

CREATE TABLE streams (
    run_id       TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    attempt      INTEGER NOT NULL CHECK (attempt >= 1),
    epoch        INTEGER NOT NULL,
    first_offset INTEGER NOT NULL,
    next_offset  INTEGER NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('open', 'closed', 'interrupted')),
    last_flush   TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    PRIMARY KEY (run_id, name, attempt),
    CHECK (next_offset > first_offset)
) WITHOUT ROWID;

CREATE TABLE stream_chunks (
    run_id       TEXT NOT NULL,
    name         TEXT NOT NULL,
    chunk_offset INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,
    data         TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (run_id, name, chunk_offset),
    FOREIGN KEY (run_id, name, attempt) REFERENCES streams (run_id, name, attempt) ON DELETE CASCADE
) WITHOUT ROWID;
