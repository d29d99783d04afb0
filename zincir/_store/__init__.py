"""Every storage operation, written once over the transaction interface (:class:`Tx`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from . import (
    _budgets,
    _calls,
    _children,
    _content,
    _ends,
    _forks,
    _keys,
    _leases,
    _log,
    _prune,
    _reads,
    _streams,
    _versions,
    _waits,
)
from ._forks import ForkOutcome
from ._tx import LIVE, BatchRefused, Reply, Tx, judge_lease
from ._types import *  # noqa: F403
from ._types import __all__ as _types

__all__ = ["LIVE", "BatchRefused", "ForkOutcome", "Reply", "Store", "Tx", "judge_lease", *_types]


class Store:
    """Every storage operation: each takes the backend's transaction first, and its docstring
    is its contract. A backend's store is an instance (of a subclass, where the backend's own
    way of an operation is measurably faster)."""

    # Operations a backend can run for several callers in one go, when a group commit holds
    # them one after another: the operation, and its batch form (``form(tx, [args, ...])``, a
    # result for each, or an exception if any call is not the common case; the thread then
    # runs each call on its own). Both backends have one for steps.
    batch_forms: ClassVar[Mapping[Callable[..., Any], Callable[..., list[Any]]]] = {}

    # -- the log, steps, sleeps and checkpoints (_log) -------------------------------------------

    complete_step = staticmethod(_log.complete_step)
    schedule_timer = staticmethod(_log.schedule_timer)
    complete_timer = staticmethod(_log.complete_timer)
    propose_checkpoint = staticmethod(_log.propose_checkpoint)
    candidate = staticmethod(_log.candidate)
    decide_checkpoint = staticmethod(_log.decide_checkpoint)
    record_response = staticmethod(_log.record_response)
    pending_tools = staticmethod(_log.pending_tools)
    start_tool = staticmethod(_log.start_tool)
    record_tool_result = staticmethod(_log.record_tool_result)

    # -- model calls in flight (_calls) -------------------------------------------------------------

    start_model_call = staticmethod(_calls.start_model_call)

    # -- how runs end (_ends) ----------------------------------------------------------------------

    finish = staticmethod(_ends.finish)
    record_attempt_failure = staticmethod(_ends.record_attempt_failure)
    release = staticmethod(_ends.release)
    watch_end = staticmethod(_ends.watch_end)
    unwatch_end = staticmethod(_ends.unwatch_end)
    cancel_run = staticmethod(_ends.cancel_run)
    cancel_child = staticmethod(_ends.cancel_child)
    owner_news = staticmethod(_ends.owner_news)

    # -- budgets (_budgets) ------------------------------------------------------------------------

    budget_usage = staticmethod(_budgets.budget_usage)
    set_budget = staticmethod(_budgets.set_budget)
    note_exceeded = staticmethod(_budgets.note_exceeded)

    # -- the inbox: signals, approvals, the audit trail (_waits) -----------------------------------

    send_signal = staticmethod(_waits.send_signal)
    await_signal = staticmethod(_waits.await_signal)
    signal_ready = staticmethod(_waits.signal_ready)
    await_approval = staticmethod(_waits.await_approval)
    decide_approval = staticmethod(_waits.decide_approval)
    approval_ready = staticmethod(_waits.approval_ready)
    record_action = staticmethod(_waits.record_action)

    # -- leases (_leases) --------------------------------------------------------------------------

    create_run = staticmethod(_leases.create_run)
    acquire_run = staticmethod(_leases.acquire_run)
    claim_due = staticmethod(_leases.claim_due)
    next_due_in = staticmethod(_leases.next_due_in)
    work_ahead = staticmethod(_leases.work_ahead)
    renew = staticmethod(_leases.renew)
    suspend = staticmethod(_leases.suspend)
    retry_now = staticmethod(_leases.retry_now)

    # -- versions (_versions) ----------------------------------------------------------------------

    set_version = staticmethod(_versions.set_version)
    skipped_for_version = staticmethod(_versions.skipped_for_version)

    # -- reading ---------------------------------------------------------------------------------

    get_run = staticmethod(_reads.get_run)
    list_runs = staticmethod(_reads.list_runs)
    events_page = staticmethod(_reads.events_page)
    durable_state = staticmethod(_reads.durable_state)
    completed_step_names = staticmethod(_reads.completed_step_names)
    step_result = staticmethod(_reads.step_result)

    # -- streams (_streams) -----------------------------------------------------------------------

    flush_stream = staticmethod(_streams.flush_stream)
    stream_page = staticmethod(_streams.stream_page)
    stream_attempts = staticmethod(_streams.stream_attempts)

    # -- child runs (_children) --------------------------------------------------------------------

    spawn_children = staticmethod(_children.spawn_children)
    await_child = staticmethod(_children.await_child)
    join_children = staticmethod(_children.join_children)
    ended_children = staticmethod(_children.ended_children)
    child_ready = staticmethod(_children.child_ready)

    # -- forks (_forks) ----------------------------------------------------------------------------

    fork_run = staticmethod(_forks.fork_run)

    # -- encryption at rest: master keys, erasure, rotation (_keys) -----------------------------

    is_encrypted = staticmethod(_keys.is_encrypted)
    prepare_keys = staticmethod(_keys.prepare_keys)
    erase_run_key = staticmethod(_keys.erase_run_key)
    rewrap_keys = staticmethod(_keys.rewrap_keys)

    # -- the content store (_content; writing and reading parts: zincir._payloads) ----------------

    sweep_content = staticmethod(_content.sweep_content)

    # -- retention (_prune) ------------------------------------------------------------------------

    oldest_kept = staticmethod(_prune.oldest_kept)
    prune_batch = staticmethod(_prune.prune_batch)
    sweep_pruned = staticmethod(_prune.sweep_pruned)
