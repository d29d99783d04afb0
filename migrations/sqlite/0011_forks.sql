-- zincir schema, version 11: forks, a new run that begins with a copy of another run's log up
-- to a seq and continues from there (docs/forks.md).
--   agent_runs.forked_from   the run it was forked from (NULL: not a fork); no foreign key, so
--                            that the lineage stays readable after the source is deleted
--   agent_runs.fork_seq      the last seq of the source that the fork copied
--   tool_intents.effect_run_id
--                            the run where the intent's effect belongs (NULL: this run): a
--                            fork's copied intents keep the run that first recorded them, so
--                            that a keyed tool sees one effect, whichever run asks for it
--   shared_children          the children a fork shares with its source (spawned in the copied
--                            prefix): a spawn under one of these names finds the shared child,
--                            the fork may join it, and its end wakes the fork too

ALTER TABLE agent_runs ADD COLUMN forked_from TEXT;
ALTER TABLE agent_runs ADD COLUMN fork_seq INTEGER;
ALTER TABLE tool_intents ADD COLUMN effect_run_id TEXT;

-- A run's forks in creation order (the inspector's family panel).
CREATE INDEX idx_agent_runs_forks ON agent_runs (forked_from, created_at, id)
    WHERE forked_from IS NOT NULL;

CREATE TABLE shared_children (
    run_id     TEXT NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    spawn_name TEXT NOT NULL,
    child_id   TEXT NOT NULL REFERENCES agent_runs (id),
    PRIMARY KEY (run_id, spawn_name)
) WITHOUT ROWID;

-- The forks that share a child, found when the child ends.
CREATE INDEX idx_shared_children_child ON shared_children (child_id);
