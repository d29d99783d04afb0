"""What a crash test checks in a database after a run: the invariants of a run that survived a crash,
and the comparison with the run that was never interrupted."""

from __future__ import annotations

import contextvars
import json
import os
from collections import Counter
from collections.abc import Mapping
from typing import Final

import attrs

from .. import _faults
from .._database import Database
from .._errors import ZincirError
from .._types import Event, EventType, RunRecord
from ._ledger import EffectLedger

__all__ = ["Observed", "compare", "observe", "workdir"]

_LIMIT: Final = 1_000_000  # runs in a crash test's database: all of them
_SHOWN: Final = 300  # characters of a checkpoint shown when two differ

_current_dir: contextvars.ContextVar[str] = contextvars.ContextVar("zincir_crash_test_dir")


def workdir() -> str:
    """The working directory of the handler whose run is being checked: inside a ``check`` given
    to :func:`crash_test`, where that boundary's handler wrote its files (its relative paths)."""
    try:
        return _current_dir.get()
    except LookupError:
        raise ZincirError("workdir() is known only inside a crash test's check") from None


@attrs.frozen
class RunOutcome:
    """How one run of the family ended, with its final accepted checkpoint (normalized JSON)."""

    status: str
    reason: str | None
    checkpoint: str | None


@attrs.frozen
class Observed:
    """What a database holds once its worker is done, in terms that compare across copies: runs
    by their key, run ids and the working directory replaced by names."""

    root_id: str
    runs: dict[str, RunOutcome]
    effects: Counter[str]
    """How often each effect was recorded in the ledger, by normalized key."""
    effect_names: dict[str, str]
    """Each effect key described for people: the tool and the call, or the key itself."""
    problems: list[str]
    """The invariants this database breaks by itself (gaps, intents without one result)."""
    names: dict[str, str]
    """Each run id, and the name that replaces it: ``<key>``."""

    def normalized(self, text: str) -> str:
        for run_id, name in self.names.items():
            text = text.replace(run_id, name)
        return text


async def observe(db: Database, ledger: EffectLedger, directory: str) -> Observed:
    records = await db.runs(limit=_LIMIT)
    logs = {record.id: await db.events(record.id) for record in records}
    keys = _keys_of(records, logs)
    names = {run_id: f"<{key}>" for run_id, key in keys.items()}
    places = sorted({directory, os.path.realpath(directory)}, key=len, reverse=True)  # noqa: ASYNC240 - no I/O

    def normalized(text: str) -> str:
        for place in places:
            text = text.replace(place, "<dir>")
        for run_id, name in names.items():
            text = text.replace(run_id, name)
        return text

    runs: dict[str, RunOutcome] = {}
    problems: list[str] = []
    tools: dict[tuple[str, str], str] = {}  # (run id, call id) -> tool name
    root_id = ""
    for record in records:
        key = keys[record.id]
        if record.parent_run_id is None:
            root_id = record.id
        events = logs[record.id]
        problems += _gaps(key, events) + _results(key, events)
        for event in events:
            if event.type == EventType.TOOL_CALL:
                tools[record.id, str(event.payload.get("call_id"))] = str(event.payload.get("name"))
        checkpoint = (await db.state(record.id)).checkpoint
        state = (
            None if checkpoint is None else normalized(json.dumps(checkpoint.state.to_json(), sort_keys=True))
        )
        runs[key] = RunOutcome(record.status.value, _end_reason(events), state)
    effects: Counter[str] = Counter()
    effect_names: dict[str, str] = {}
    for key, count in ledger.counts().items():
        name = normalized(key)
        effects[name] += count
        effect_names[name] = _effect_name(key, name, keys, tools)
    return Observed(root_id, runs, effects, effect_names, problems, names)


def compare(reference: Observed, observed: Observed) -> list[str]:
    """Every way ``observed`` (after a crash) breaks an invariant or differs from ``reference``
    (the uninterrupted run) where it must not."""
    problems = list(observed.problems)
    for key in sorted(reference.runs.keys() | observed.runs.keys()):
        before, after = reference.runs.get(key), observed.runs.get(key)
        if after is None:
            problems.append(f"run {key} of the uninterrupted run does not exist after the crash")
        elif before is None:
            problems.append(f"run {key} exists only after the crash (it is {after.status})")
        elif after.status != before.status:
            why = f" ({after.reason})" if after.reason else ""
            problems.append(f"run {key} is {after.status}{why}, not {before.status}")
        elif after.checkpoint != before.checkpoint:
            problems.append(
                f"run {key}: the final accepted checkpoint differs from the uninterrupted run's:"
                f" {_shown(after.checkpoint)} instead of {_shown(before.checkpoint)}"
            )
    for key in sorted(reference.effects.keys() | observed.effects.keys()):
        times, expected = observed.effects[key], reference.effects[key]
        name = observed.effect_names.get(key) or reference.effect_names[key]
        if times > 1 and times > expected:
            problems.append(f"{name} applied its effect {_times(times)} ({_times(expected)} uninterrupted)")
        elif times == 0 and expected:
            problems.append(f"{name} never applied its effect ({_times(expected)} uninterrupted)")
    return problems


def in_directory(directory: str) -> contextvars.Token[str]:
    return _current_dir.set(directory)


def leave_directory(token: contextvars.Token[str]) -> None:
    _current_dir.reset(token)


def _keys_of(records: list[RunRecord], logs: Mapping[str, list[Event]]) -> dict[str, str]:
    """Each run's key (see zincir/_faults.py): the same run has the same key in every copy."""
    spawned: dict[str, tuple[str, str]] = {}  # child id -> (parent id, name)
    for parent_id, events in logs.items():
        for event in events:
            if event.type == EventType.CHILD_SPAWNED:
                spawned[str(event.payload["child_id"])] = (parent_id, str(event.payload["name"]))
    keys: dict[str, str] = {}

    def key_of(run_id: str) -> str:
        if run_id not in keys:
            parent = spawned.get(run_id)
            keys[run_id] = _faults.ROOT if parent is None else _faults.child_key(key_of(parent[0]), parent[1])
        return keys[run_id]

    for record in records:
        key_of(record.id)
    return keys


def _gaps(key: str, events: list[Event]) -> list[str]:
    seqs = [event.seq for event in events]
    if seqs == list(range(len(seqs))):
        return []
    missing = sorted(set(range(max(seqs) + 1)) - set(seqs))
    return [f"run {key}: its log is not gap-free: seq {', '.join(map(str, missing[:10]))} missing"]


def _results(key: str, events: list[Event]) -> list[str]:
    """Every intent has exactly one result, and every result an intent."""
    intents = {
        str(e.payload.get("call_id")): str(e.payload.get("name"))
        for e in events
        if e.type == EventType.TOOL_CALL
    }
    results = Counter(str(e.payload.get("call_id")) for e in events if e.type == EventType.TOOL_RESULT)
    problems = []
    for call_id, tool in intents.items():
        if results[call_id] != 1:
            problems.append(f"run {key}: tool call {call_id} ({tool}) has {_results_text(results[call_id])}")
    for call_id in results.keys() - intents.keys():
        problems.append(f"run {key}: a result for call {call_id}, which has no intent")
    return problems


def _end_reason(events: list[Event]) -> str | None:
    for event in reversed(events):
        if event.type == EventType.STATE_TRANSITION:
            reason = event.payload.get("reason")
            return None if reason is None else str(reason)
    return None


def _effect_name(key: str, name: str, keys: Mapping[str, str], tools: Mapping[tuple[str, str], str]) -> str:
    run_id, marker, call_id = key.partition(":tool_call:")
    if marker and run_id in keys:
        tool = tools.get((run_id, call_id), "?")
        return f"tool {tool} (call {call_id} of {keys[run_id]})"
    return f"the effect {name!r}"


def _times(count: int) -> str:
    return {0: "never", 1: "once", 2: "twice"}.get(count, f"{count} times")


def _results_text(count: int) -> str:
    return "no result" if count == 0 else f"{count} results"


def _shown(text: str | None) -> str:
    if text is None:
        return "none"
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "…"
