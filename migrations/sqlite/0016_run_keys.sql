-- zincir schema, version 16: encryption at rest and erasure (docs/payloads.md#encryption-and-erasure).
--   encryption_keys   one row per master key that ever wrapped a run's key: its id (as the key
--                     provider names it) and a check value (a known text encrypted with it), so
--                     that a wrong key is refused when the database is opened, before any write
--   run_keys          one row per run of an encrypted database (written just before the run, so
--                     its reference is checked at COMMIT): the run's own data key (a random
--                     256-bit AES key), wrapped (AES-GCM) by the master key key_id names.
--                     erased_at: when zincir.erase_run deleted the wrapped key (it is NULL from
--                     then on, and the run's payloads can never be read again)

CREATE TABLE encryption_keys (
    key_id      TEXT PRIMARY KEY,
    check_value TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE TABLE run_keys (
    run_id      TEXT PRIMARY KEY REFERENCES agent_runs (id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    key_id      TEXT,
    wrapped_dek TEXT,
    created_at  INTEGER NOT NULL,
    erased_at   INTEGER,
    CHECK ((erased_at IS NULL) = (wrapped_dek IS NOT NULL))
) WITHOUT ROWID;

CREATE INDEX idx_run_keys_key ON run_keys (key_id) WHERE key_id IS NOT NULL;
