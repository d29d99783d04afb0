"""The JSON API: the runs list, a run with its lists, a page of events, and one whole item
(an event, a step, a checkpoint).

Answers are bounded like the pages: lists stop at :data:`~._views.LIST_LIMIT` items or once
their stored values add up to :data:`API_BUDGET_CHARS`, each long value is given as its
beginning with the URL of the whole item, and a response says where to continue.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from quart import Response

from .. import _queries as q
from .._errors import RunNotFound
from . import _views as v
from ._http import json_response, run_read
from ._params import EventsQuery, RunsQuery, cursor_arg, token_json
from ._security import InspectorApp
from ._views import CHILDREN_PAGE, ITEM_PREVIEW_CHARS, LIST_LIMIT

__all__ = ["API_BUDGET_CHARS", "api_checkpoint", "api_event", "api_events", "api_run", "api_runs", "api_step"]


#: A JSON API list stops adding items once their stored values add up to this many characters
#: (at least one item is always given); the response says where to continue.
API_BUDGET_CHARS = 4 * 1024 * 1024


async def api_runs(app: InspectorApp) -> Response:
    query = RunsQuery.from_request()
    page = await run_read(app, query.fetch)
    return json_response(
        {
            "runs": [q.run_to_json(run) for run in page.runs],
            "counts": dict(page.counts),
            "total": page.total,
            "capped": sorted(page.capped),
            "newer": page.runs[0].cursor.encode() if page.has_newer else None,
            "older": page.runs[-1].cursor.encode() if page.has_older else None,
        }
    )


class _Budget:
    """Characters a JSON list response may still spend; the first item is always allowed."""

    def __init__(self, chars: int) -> None:
        self.left, self.spent_any = chars, False

    def take(self, chars: int) -> bool:
        if self.spent_any and chars > self.left:
            return False
        self.left -= chars
        self.spent_any = True
        return True


def _run_json(run_id: str, children_after: q.RunCursor | None, conn: Any) -> dict[str, Any]:
    """The run and its first checkpoints, steps and timers (``truncated`` says if a list is cut).

    Checkpoint states and verifications and step results longer than ITEM_PREVIEW_CHARS are
    given as their beginning, with the ``url`` of the whole item; the lists stop at LIST_LIMIT
    items or once their values add up to API_BUDGET_CHARS.
    """
    run = q.get_run(conn, run_id, children_limit=CHILDREN_PAGE, children_after=children_after)
    checkpoints = q.list_checkpoints(conn, run_id, limit=LIST_LIMIT + 1, max_chars=ITEM_PREVIEW_CHARS)
    steps = q.list_steps(conn, run_id, limit=LIST_LIMIT + 1, max_chars=ITEM_PREVIEW_CHARS)
    timers = q.list_timers(conn, run_id, limit=LIST_LIMIT + 1)
    awaiting = q.list_awaiting(conn, [run_id]).get(run_id, ())
    outsider_actions = q.list_outsider_actions(conn, run_id, limit=LIST_LIMIT + 1)
    budget = _Budget(API_BUDGET_CHARS)
    checkpoint_items = []
    for c in checkpoints[:LIST_LIMIT]:
        if not budget.take(len(c.state) + len(c.verification or "")):
            break
        item = q.checkpoint_to_json(run_id, c)
        if c.truncated:
            item["url"] = v.checkpoint_api_url(run_id, c)
        checkpoint_items.append(item)
    step_items = []
    for s in steps[:LIST_LIMIT]:
        if not budget.take(len(s.result or "")):
            break
        item = q.step_to_json(run_id, s)
        if s.truncated:
            item["url"] = v.step_api_url(run_id, s)
        step_items.append(item)
    return {
        "run": q.run_to_json(run),
        "children_total": run.children_total,
        "children_capped": run.children_capped,
        "children_next": run.children_next.encode() if run.children_next else None,
        "checkpoints": checkpoint_items,
        "steps": step_items,
        "timers": [q.timer_to_json(run_id, t) for t in timers[:LIST_LIMIT]],
        "awaiting": [q.awaiting_to_json(a) for a in awaiting[:LIST_LIMIT]],
        "outsider_actions": [q.outsider_action_to_json(a) for a in outsider_actions[:LIST_LIMIT]],
        "truncated": {
            "checkpoints": len(checkpoint_items) < len(checkpoints),
            "steps": len(step_items) < len(steps),
            "timers": len(timers) > LIST_LIMIT,
            "outsider_actions": len(outsider_actions) > LIST_LIMIT,
        },
    }


async def api_run(app: InspectorApp, run_id: str) -> Response:
    run_id = q.parse_run_id(run_id)
    children_after = cursor_arg("children_after")
    return json_response(await run_read(app, functools.partial(_run_json, run_id, children_after)))


def _events_json(run_id: str, query: EventsQuery, conn: Any) -> dict[str, Any]:
    q.get_run(conn, run_id, children_limit=0)
    page = query.fetch(run_id, conn, max_chars_total=API_BUDGET_CHARS)
    return {
        "events": [q.event_to_json(run_id, e) for e in page.events],
        "has_before": page.has_before,
        "has_after": page.has_after,
        "next_after": token_json(page.next_after) if page.has_after else None,
        "prev_before": token_json(page.prev_before) if page.has_before else None,
        "scan_edge": token_json(page.scan_edge) if page.scan_edge is not None else None,
    }


async def api_events(app: InspectorApp, run_id: str) -> Response:
    run_id = q.parse_run_id(run_id)
    query = EventsQuery.from_request(q.DEFAULT_PAGE, None)
    return json_response(await run_read(app, functools.partial(_events_json, run_id, query)))


async def _api_item(
    app: InspectorApp,
    run_id: str,
    kind: str,
    key: object,
    missing: str,
    fetch: Callable[..., Any],
    to_json: Callable[..., Any],
) -> Response:
    """One whole event, step or checkpoint of a run, or a 404 naming ``missing``."""
    run_id = q.parse_run_id(run_id)

    def read(conn: Any) -> dict[str, Any]:
        q.get_run(conn, run_id, children_limit=0)
        item = fetch(conn, run_id, key)
        if item is None:
            raise RunNotFound(f"run {run_id} has no {missing}")
        return {kind: to_json(run_id, item)}

    return json_response(await run_read(app, read))


async def api_event(app: InspectorApp, run_id: str, seq: str) -> Response:
    value = q.decode_key(seq, "event seq")
    missing = f"event #{q.encode_key(value)}"
    return await _api_item(app, run_id, "event", value, missing, q.get_event, q.event_to_json)


async def api_step(app: InspectorApp, run_id: str, name: str) -> Response:
    return await _api_item(app, run_id, "step", name, f"step {name[:80]!r}", q.get_step, q.step_to_json)


async def api_checkpoint(app: InspectorApp, run_id: str, round: str) -> Response:
    value = q.decode_key(round, "checkpoint round")
    missing = f"checkpoint round {q.encode_key(value)}"
    return await _api_item(app, run_id, "checkpoint", value, missing, q.get_checkpoint, q.checkpoint_to_json)
