"""Forks: a new run that begins with a copy of another run's log up to a seq (docs/forks.md).

A fork is one outsider's write, in one transaction: the source's row is locked (its owner's
writes wait, on PostgreSQL they fail and are retried), so the fork sees one consistent prefix
while the owner goes on writing, and a crash leaves either no fork or a whole one.

What the fork holds is what the source held *as of* the fork point, with one exception that
the whole design turns on: an effect that happened in the world is never repeated. So

- events ``0..at_seq`` are copied as they are (type, payload, seq, key, time), then a
  ``forked`` event names the source and the seq;
- a tool intent of the prefix whose result the source recorded, even after ``at_seq``, gets
  that result (a ``tool_result`` marked ``inherited``); one the source started without a
  result stays pending with its start count, so a probe runs before anything else; and every
  intent keeps the run where its effect belongs (``effect_run_id``);
- the projections of the log (checkpoints, completed waits, approvals, joins) are copied as
  the prefix's events left them, found by their events' keys; steps and sleeps, which log no
  event, by time: those begun by the time of the event at ``at_seq`` (a step that began may
  have had its effect);
- children spawned in the prefix are shared, not copied (``shared_children``);
- a budget's spend is what the prefix's responses spent, counted again from their usage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .._budget import LIMIT_COLUMNS, CountedCall, SpendSum, debit_of, loop_of
from .._errors import InvalidForkPoint, RunErased, RunNotFound
from .._json import decode
from .._json import dump_trusted as _dump
from .._payloads import Unreferenced, copy_refs, refer, resolved, stored_unreferenced
from .._types import EventType, ToolCall
from .._validation import MAX_INT
from ._log import insert_event
from ._tx import Tx
from ._types import SUBMIT_CHECKPOINT, args_hash

__all__ = ["ForkOutcome", "fork_run"]


@attrs.frozen
class ForkOutcome:
    """What a fork did: the new run, the last seq of the source it copied, and how many tool
    results it inherited from after that seq."""

    fork_id: str
    fork_seq: int
    inherited: int
    role: str = ""
    provider: str = ""
    source_traceparent: str | None = None
    """The source's stored trace context, which the fork's creation links to (docs/tracing.md)."""


def _logged(run: str, key: str) -> str:
    """SQL for the seq of the event of run ``run`` whose key is ``key`` (SQL expressions): a
    subquery per row of the (small) table it is asked for, by the partial index on keys
    (idx_events_idempotency, whose terms it repeats so that both planners use it), so that no
    statement here walks the prefix's events."""
    return (
        f"(SELECT e.seq FROM events AS e WHERE e.run_id = {run} AND e.idempotency_key = {key}"
        " AND e.idempotency_key IS NOT NULL AND e.type NOT IN ('tool_call', 'tool_result'))"
    )


def fork_run(
    tx: Tx,
    source_id: str,
    fork_id: str,
    at_seq: int | None,
    at_checkpoint: int | None,
    config_json: str | None,
    by: str | None,
    reason: str | None,
    traceparent: str | None = None,
) -> ForkOutcome:
    """Create run ``fork_id``, pending and claimable, from ``source_id``'s log up to
    ``at_seq`` (or to the tool result that answered the checkpoint accepted in round
    ``at_checkpoint``); ``config_json`` replaces the config; ``traceparent`` is the fork's own
    trace context (its creation's span). RunNotFound, InvalidForkPoint."""
    source = tx.lock_run(source_id, "last_seq, role, provider, config, version, fingerprints, traceparent")
    if source is None:
        raise RunNotFound(f"run {source_id} does not exist")
    last_seq, role, provider, stored_config, version, fingerprints, source_traceparent = source
    if tx.sealer is not None:
        _refuse_erased_history(tx, source_id)
    at, forked_at = _fork_point(tx, source_id, int(last_seq), at_seq, at_checkpoint)
    inherited = tx.all(  # read through zincir._payloads below, with the fork's row written
        "SELECT t.call_id, e.seq, e.payload FROM tool_intents AS t"
        " JOIN events AS e ON e.run_id = t.run_id AND e.seq = t.result_seq"
        " WHERE t.run_id = ? AND t.intent_seq <= ? AND t.result_seq > ? AND t.name <> ?"
        " ORDER BY t.intent_seq",
        (source_id, at, at, SUBMIT_CHECKPOINT),
    )
    config, config_parts = _config(tx, fork_id, config_json, stored_config)
    tx.execute(
        "INSERT INTO agent_runs (id, role, provider, status, config, created_at, updated_at, last_seq,"
        " next_attempt_at, forked_from, fork_seq, version, fingerprints, traceparent)"
        " VALUES (?, ?, ?, 'pending', ?, :now, :now, ?, :now, ?, ?, ?, ?, ?)",
        (
            *(fork_id, role, provider, config),
            *(at + 1 + len(inherited), source_id, at),
            *(version, fingerprints),  # the fork runs on its source's version (docs/versions.md)
            traceparent,
        ),
    )
    # The copied columns below keep their stored form (references included): the fork refers to
    # what its source does, so that deleting the source leaves the fork whole.
    copy_refs(tx, source_id, fork_id)
    refer(tx, fork_id, config_parts)
    inherited = resolved(tx, inherited, (2,))
    tx.execute(
        "INSERT INTO events (run_id, seq, type, payload, idempotency_key, created_at)"
        " SELECT ?, seq, type, payload, idempotency_key, created_at FROM events"
        " WHERE run_id = ? AND seq <= ? ORDER BY seq",
        (fork_id, source_id, at),
    )
    forked = {
        "by": by, "config_changed": config_json is not None, "fork_seq": at, "forked_from": source_id,
        "reason": reason,
    }  # fmt: skip
    insert_event(tx, fork_id, at + 1, EventType.FORKED, _dump(forked))
    _copy_intents(tx, source_id, fork_id, at, inherited)
    _copy_checkpoints(tx, source_id, fork_id, at)
    _copy_steps_and_sleeps(tx, source_id, fork_id, forked_at)
    _copy_waits(tx, source_id, fork_id, at)
    _copy_approvals(tx, source_id, fork_id, at)
    _share_children(tx, source_id, fork_id, at)
    _copy_budget(tx, source_id, fork_id, at)
    tx.wake(claimable=True)
    return ForkOutcome(fork_id, at, len(inherited), role, provider or "", source_traceparent)


def _config(tx: Tx, fork_id: str, config_json: str | None, stored_config: str) -> tuple[str, Unreferenced]:
    """The fork's config column, the one given or the source's as stored, and what the fork
    must refer to for it (beyond its source's, which it refers to all): on an encrypted
    database its own key too, for what it writes (what it copies stays under its source's key,
    which its envelopes name, so that erasing the source erases the copies too)."""
    if config_json is not None:
        return stored_unreferenced(tx, config_json, fork_id)
    if tx.sealer is not None:
        return stored_config, Unreferenced(key=tx.sealer.fresh(fork_id))
    return stored_config, Unreferenced()


_LINEAGE = (
    "WITH RECURSIVE lineage (id) AS (SELECT id FROM agent_runs WHERE id = ?"
    " UNION SELECT r.forked_from FROM agent_runs AS r JOIN lineage AS l ON r.id = l.id"
    " WHERE r.forked_from IS NOT NULL)"
    " SELECT id FROM lineage"
)


def _refuse_erased_history(tx: Tx, source_id: str) -> None:
    """RunErased if ``source_id`` or a run it was forked from (whose values a fork's copy
    holds, under that run's key) was erased. On PostgreSQL their rows are held shared until
    COMMIT, so an erasure (which locks the run, then looks for live forks) waits for this fork
    and then sees it."""
    lineage = [row[0] for row in tx.all(_LINEAGE, (source_id,))]
    where, params = tx.dialect.any_of("id", lineage)
    if tx.dialect.row_locks:
        tx.all(f"SELECT id FROM agent_runs AS r WHERE {where} FOR SHARE OF r", params)
    where, params = tx.dialect.any_of("run_id", lineage)
    erased = tx.one(f"SELECT run_id FROM run_keys WHERE {where} AND erased_at IS NOT NULL LIMIT 1", params)
    if erased is not None:
        whose = "it" if erased[0] == source_id else f"run {erased[0]}, whose history it copied,"
        raise RunErased(f"run {source_id} cannot be forked: {whose} was erased")


def _fork_point(
    tx: Tx, source_id: str, last_seq: int, at_seq: int | None, at_checkpoint: int | None
) -> tuple[int, int]:
    """The seq to fork at, checked, and the time of its event. InvalidForkPoint."""
    if at_checkpoint is not None:
        row = tx.one(
            "SELECT status, decision_event_seq FROM checkpoints WHERE run_id = ? AND round = ?",
            (source_id, at_checkpoint),
        )
        if row is None or row[0] != "accepted":
            found = "none" if row is None else f"its checkpoint of that round was {row[0]}"
            raise InvalidForkPoint(
                f"run {source_id} has no accepted checkpoint of round {at_checkpoint} to fork at ({found})"
            )
        at = int(row[1]) + 1  # the tool result that answered the checkpoint's call
    else:
        assert at_seq is not None
        at = at_seq
    where = f"run {source_id}: cannot fork at seq {at}"
    if at < 0:
        raise InvalidForkPoint(f"{where}: a seq is 0 or more")
    if at > last_seq:
        end = "it has no events yet" if last_seq < 0 else f"its last seq is {last_seq}"
        raise InvalidForkPoint(f"{where}: past the end of its log ({end})")
    here = tx.send("SELECT created_at FROM events WHERE run_id = ? AND seq = ?", (source_id, at))
    after = tx.send(
        "SELECT type, idempotency_key FROM events WHERE run_id = ? AND seq = ?", (source_id, at + 1)
    )
    (forked_at,) = here.one()
    _refuse_a_split(tx, source_id, at, after.one(), where)
    return at, int(forked_at)


def _refuse_a_split(tx: Tx, source_id: str, at: int, after: Any, where: str) -> None:
    """Refuse a seq inside what one write logged together (``after``: the type and key of the
    event after it, None at the end): a model response and its tool calls (their intents are
    one), a checkpoint's decision and the tool result it answers."""
    if after is None:
        return
    type, key = after
    if type == EventType.TOOL_CALL.value:
        call_id = str(key).removeprefix("tool_call:")
        response_seq, count = tx.one(
            "SELECT response_seq, response_tool_count FROM tool_intents WHERE run_id = ? AND call_id = ?",
            (source_id, call_id),
        )
        first, last = int(response_seq), int(response_seq) + int(count)
        raise InvalidForkPoint(
            f"{where}: the model response at seq {first} and its tool calls (to seq {last}) were"
            f" recorded together; fork at seq {first - 1} or {last}"
        )
    if type == EventType.TOOL_RESULT.value and str(key).startswith("checkpoint:"):
        raise InvalidForkPoint(
            f"{where}: the checkpoint decision at seq {at} and the tool result answering it (seq"
            f" {at + 1}) were recorded together; fork at seq {at - 1} or {at + 1}"
        )


def _copy_intents(tx: Tx, source_id: str, fork_id: str, at: int, inherited: Sequence[Any]) -> None:
    """The prefix's intents, each with the run its effect belongs to; a result recorded by the
    source after ``at`` is inherited: logged after the ``forked`` event, marked so."""
    tx.execute(
        "INSERT INTO tool_intents (run_id, call_id, name, intent_seq, response_seq, response_tool_count,"
        " result_seq, started, last_started_at, effect_run_id)"
        " SELECT ?, call_id, name, intent_seq, response_seq, response_tool_count,"
        " CASE WHEN result_seq <= ? THEN result_seq END, started, last_started_at, coalesce(effect_run_id, ?)"
        " FROM tool_intents WHERE run_id = ? AND intent_seq <= ?",
        (fork_id, at, source_id, source_id, at),
    )
    for seq, (call_id, source_seq, payload_json) in enumerate(inherited, start=at + 2):
        payload = {**decode(payload_json), "inherited": {"run_id": source_id, "seq": source_seq}}
        insert_event(tx, fork_id, seq, EventType.TOOL_RESULT, _dump(payload), f"tool_result:{call_id}")
        tx.execute(
            "UPDATE tool_intents SET result_seq = ? WHERE run_id = ? AND call_id = ?", (seq, fork_id, call_id)
        )


def _copy_checkpoints(tx: Tx, source_id: str, fork_id: str, at: int) -> None:
    """Checkpoints proposed in the prefix (the proposal is logged at based_on_event_seq + 1); one
    decided after ``at`` is a candidate again, for the fork's verifier to decide."""
    decided = "CASE WHEN decision_event_seq <= ? THEN {} END"
    tx.execute(
        "INSERT INTO checkpoints (run_id, round, tool_call_id, based_on_event_seq, decision_event_seq,"
        " status, state, verification, created_at, decided_at)"
        f" SELECT ?, round, tool_call_id, based_on_event_seq, {decided.format('decision_event_seq')},"
        " CASE WHEN decision_event_seq <= ? THEN status ELSE 'candidate' END, state,"
        f" {decided.format('verification')}, created_at, {decided.format('decided_at')}"
        " FROM checkpoints WHERE run_id = ? AND based_on_event_seq < ? ORDER BY round",
        (fork_id, at, at, at, at, source_id, at),
    )


def _copy_steps_and_sleeps(tx: Tx, source_id: str, fork_id: str, forked_at: int) -> None:
    """Steps begun and sleeps scheduled by the time of the fork point's event (they log no
    event of their own: time is what places them)."""
    tx.execute(
        "INSERT INTO steps (run_id, name, status, epoch, result, started_at, completed_at)"
        " SELECT ?, name, status, epoch, result, started_at, completed_at FROM steps"
        " WHERE run_id = ? AND status = 'completed' AND started_at <= ?",
        (fork_id, source_id, forked_at),
    )
    tx.execute(
        "INSERT INTO timers (run_id, name, wake_at, created_at, completed_at)"
        " SELECT ?, name, wake_at, created_at, CASE WHEN completed_at <= ? THEN completed_at END"
        " FROM timers WHERE run_id = ? AND created_at <= ?",
        (fork_id, forked_at, source_id, forked_at),
    )


def _copy_waits(tx: Tx, source_id: str, fork_id: str, at: int) -> None:
    """Named waits the prefix decided (a signal received, or a timeout), each with its signal
    copied into the fork's inbox as consumed. A wait still open at ``at`` starts again."""
    decided = _logged("w.run_id", "'wait:' || w.name")
    rows = tx.all(
        "SELECT w.name, w.kind, w.topic, w.deadline, w.created_at, w.completed_at, w.timed_out,"
        " s.topic, s.payload, s.key, s.created_at, s.consumed_at FROM waits AS w"
        f" LEFT JOIN signals AS s ON s.id = w.signal_id WHERE w.run_id = ? AND {decided} <= ?",
        (source_id, at),
    )
    for name, kind, topic, deadline, created_at, completed_at, timed_out, *signal in rows:
        signal_id = None
        if signal[0] is not None:
            s_topic, payload, key, sent_at, consumed_at = signal
            (signal_id,) = tx.one(
                "INSERT INTO signals (run_id, topic, payload, key, created_at, consumed_by, consumed_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (fork_id, s_topic, payload, key, sent_at, name, consumed_at),
            )
        tx.execute(
            "INSERT INTO waits (run_id, name, kind, topic, deadline, created_at, completed_at, signal_id,"
            " timed_out) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (fork_id, name, kind, topic, deadline, created_at, completed_at, signal_id, timed_out),
        )


def _copy_approvals(tx: Tx, source_id: str, fork_id: str, at: int) -> None:
    """Approvals requested in the prefix, as the prefix left them: decided if their decision
    was logged by ``at``, timed out if that was, else open (decided again for the fork)."""
    requested, decided, timed_out = (
        _logged("a.run_id", f"'approval:' || a.call_id || ':{what}'")
        for what in ("requested", "decided", "timed_out")
    )
    rows = tx.all(
        "SELECT a.call_id, a.tool_name, a.args_hash, a.requested_at, a.deadline, a.approved,"
        f" a.decided_by, a.reason, a.decided_at, a.logged_at, {decided}, {timed_out} FROM approvals AS a"
        f" WHERE a.run_id = ? AND {requested} <= ?",
        (source_id, at),
    )
    for (
        call_id,
        tool,
        hash_,
        requested_at,
        deadline,
        approved,
        by,
        reason,
        decided_at,
        logged_at,
        d,
        x,
    ) in rows:
        d = d if d is not None and d <= at else None
        x = x if x is not None and x <= at else None
        if d is None:
            approved = by = reason = decided_at = logged_at = None
        tx.execute(
            "INSERT INTO approvals (run_id, call_id, tool_name, args_hash, requested_at, deadline,"
            " approved, decided_by, reason, decided_at, timed_out, logged_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (fork_id, call_id, tool, hash_, requested_at, deadline, approved, by, reason, decided_at,
             int(d is None and x is not None), logged_at),
        )  # fmt: skip


def _share_children(tx: Tx, source_id: str, fork_id: str, at: int) -> None:
    """The children spawned in the prefix (the source's own, and those it shares itself) are
    the fork's too; the joins the prefix ended are copied (one still open starts again)."""
    own = _logged("c.parent_run_id", "'spawn:' || c.spawn_name")
    shared = _logged("s.run_id", "'spawn:' || s.spawn_name")
    joined = _logged("j.run_id", "'join:' || j.child_id")
    tx.execute(
        "INSERT INTO shared_children (run_id, spawn_name, child_id)"
        " SELECT ?, c.spawn_name, c.id FROM agent_runs AS c WHERE c.parent_run_id = ?"
        f" AND c.spawn_name IS NOT NULL AND {own} <= ?"
        " UNION ALL SELECT ?, s.spawn_name, s.child_id FROM shared_children AS s"
        f" WHERE s.run_id = ? AND {shared} <= ?",
        (fork_id, source_id, at, fork_id, source_id, at),
    )
    tx.execute(
        "INSERT INTO joins (run_id, child_id, deadline, created_at, completed_at, timed_out)"
        " SELECT ?, j.child_id, j.deadline, j.created_at, j.completed_at, j.timed_out FROM joins AS j"
        f" WHERE j.run_id = ? AND {joined} <= ?",
        (fork_id, source_id, at),
    )


def _copy_budget(tx: Tx, source_id: str, fork_id: str, at: int) -> None:
    """The source's limits, and what its responses in the prefix spent (counted again from
    their usage, as recording them debited it), with loop detection's window as it stood."""
    limits = tx.one(f"SELECT {', '.join(LIMIT_COLUMNS)} FROM budgets WHERE run_id = ?", (source_id,))
    if limits is None:
        return
    counting = limits[LIMIT_COLUMNS.index("max_identical_tool_calls")] is not None
    rows = tx.all(
        "SELECT type, payload FROM events WHERE run_id = ? AND seq <= ? AND type IN (?, ?) ORDER BY seq",
        (source_id, at, EventType.LLM_CALL.value, EventType.CHECKPOINT_ACCEPTED.value),
    )
    spent = _Spent()
    for type, payload_json in resolved(tx, rows, (1,)):
        if type == EventType.CHECKPOINT_ACCEPTED.value:
            spent.progress()
        else:
            spent.debit(decode(payload_json), counting, f"run {source_id}")
    columns = ", ".join(LIMIT_COLUMNS)
    tx.execute(
        f"INSERT INTO budgets (run_id, {columns}, input_tokens, output_tokens, cost, model_calls, tool_calls,"
        " most_identical_tool_calls, repeated_call_id, responses_without_progress, updated_at)"
        f" VALUES (?, {', '.join('?' * len(LIMIT_COLUMNS))}, ?, ?, ?, ?, ?, ?, ?, ?, :now)",
        (fork_id, *limits, *spent.row()),
    )
    for hash_, count in spent.window.items():
        tx.execute(
            "INSERT INTO tool_call_counts (run_id, args_hash, count) VALUES (?, ?, ?)",
            (fork_id, hash_, count),
        )


@attrs.define
class _Spent:
    """A budget's spend, added up response by response as ``_budgets.debit_budget`` does."""

    total: SpendSum = attrs.Factory(SpendSum)
    without_progress: int = 0
    window: dict[str, int] = attrs.Factory(dict)
    identical: int = 0
    repeated_id: str | None = None

    def debit(self, response: dict[str, Any], counting: bool, what: str) -> None:
        calls = tuple(
            CountedCall(ToolCall(c["id"], c["name"], c["args"]), args_hash(c["name"], c["args"]))
            for c in response["tool_calls"]
        )
        debit = debit_of(response.get("usage"), calls, what)
        self.total = self.total.plus(debit, len(calls))
        self.without_progress += 1
        if counting:
            for hash_, count in debit.counts().items():
                self.window[hash_] = self.window.get(hash_, 0) + count
            self.identical, repeated = loop_of(debit, self.window) if calls else (0, None)
            self.repeated_id = None if repeated is None else repeated.id

    def progress(self) -> None:
        """An accepted checkpoint: the loop window starts again."""
        self.without_progress, self.identical, self.repeated_id = 0, 0, None
        self.window.clear()

    def row(self) -> tuple[Any, ...]:
        """The budget's spent columns; a count past the largest BIGINT is capped, as the store's
        sums are (capping the total caps each partial sum: the counts only grow)."""
        s = self.total
        return (
            min(s.input_tokens, MAX_INT), min(s.output_tokens, MAX_INT), s.cost, s.model_calls,
            min(s.tool_calls, MAX_INT), self.identical, self.repeated_id, self.without_progress,
        )  # fmt: skip
