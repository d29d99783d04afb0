-- zincir schema, version 17: a durable step writes one page, not two.
--   steps is rebuilt WITHOUT ROWID: its rows live in the b-tree of its primary key
--   (run_id, name). Before, a step's row went into the table's rowid b-tree and its key into the
--   primary key's index, two b-trees and so two pages in every step's commit (measured with the
--   WAL's frames: 2.16 pages per sequential step, the raw one-INSERT loop's 1). Every read of
--   steps goes by (run_id, name) or by run_id, the key's prefix, so nothing reads the rowid.
--   A result larger than about 1 KB spills to overflow pages (a rowid table keeps up to 4 KB in
--   the row's page): big results cost the same pages either way, small ones half.

CREATE TABLE steps_keyed (
    run_id       TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    name         TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    status       TEXT NOT NULL CHECK (status IN ('running', 'completed')),
    -- Lease epoch of the owner that claimed (and, once completed, finished) the step.
    epoch        INTEGER NOT NULL,
    result       TEXT,
    started_at   INTEGER NOT NULL,
    completed_at INTEGER,
    PRIMARY KEY (run_id, name)
) WITHOUT ROWID;

INSERT INTO steps_keyed (run_id, name, status, epoch, result, started_at, completed_at)
    SELECT run_id, name, status, epoch, result, started_at, completed_at FROM steps;

DROP TABLE steps;

ALTER TABLE steps_keyed RENAME TO steps;
