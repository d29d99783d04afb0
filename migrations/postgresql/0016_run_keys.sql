-- zincir schema, version 16, for PostgreSQL: encryption at rest and erasure (see the SQLite file).

CREATE TABLE encryption_keys (
    key_id      TEXT COLLATE "C" PRIMARY KEY,
    check_value TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE run_keys (
    run_id      TEXT COLLATE "C" PRIMARY KEY REFERENCES agent_runs (id) ON DELETE CASCADE
                DEFERRABLE INITIALLY DEFERRED,
    key_id      TEXT COLLATE "C",
    wrapped_dek TEXT,
    created_at  BIGINT NOT NULL,
    erased_at   BIGINT,
    CHECK ((erased_at IS NULL) = (wrapped_dek IS NOT NULL))
);

CREATE INDEX idx_run_keys_key ON run_keys (key_id) WHERE key_id IS NOT NULL;
