"""View models: the plain data each page template reads, prepared from the read queries.

Nothing here builds markup. Values are strings, numbers, stored rows (whose fields may be
:class:`zincir._queries.Malformed` placeholders: the templates show those as such) and small
records of links. URLs are built here, percent-encoded; the templates escape them again.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from .. import _queries as q
from .._errors import InvalidArgument
from ._plain import human_delta
from ._render import pretty_value

#: Checkpoints, steps, timers and tool calls listed at most on a run page.
LIST_LIMIT = 500
#: Characters of a run's configuration and result, and of a checkpoint's state on its own
#: page, shown before cutting (the JSON API gives them whole).
BLOCK_CHARS = 256 * 1024
#: Characters of each checkpoint state or verification and each step result in a list (page
#: and JSON API alike); the per-item JSON endpoints give the whole value.
ITEM_PREVIEW_CHARS = 8 * 1024
#: Children listed per page of the family section (and of the JSON API).
CHILDREN_PAGE = 100
LIVE = ("pending", "running", "waiting")
TERMINAL = ("completed", "failed", "cancelled")


# --------------------------------------------------------------------------- urls


def path(*segments: object) -> str:
    """An absolute URL path; each segment is percent-encoded (``/`` included)."""
    return "/" + "/".join(urllib.parse.quote(str(s), safe="") for s in segments)


def url(base: str, params: Mapping[str, Any]) -> str:
    kept = {k: str(v) for k, v in params.items() if v is not None}
    return f"{base}?{urllib.parse.urlencode(kept, quote_via=urllib.parse.quote)}" if kept else base


def fragment(address: str, anchor: str) -> str:
    return f"{address}#{urllib.parse.quote(anchor, safe='')}"


def anchor(seq: object) -> str:
    return "e" + q.encode_key(seq)


def checkpoint_api_url(run_id: str, checkpoint: q.CheckpointRow) -> str:
    return path("api", "runs", run_id, "checkpoints", q.encode_key(checkpoint.round))


def checkpoint_page_url(run_id: str, round: object) -> str:
    return path("runs", run_id, "checkpoints", q.encode_key(round))


def step_api_url(run_id: str, step: q.StepRow) -> str:
    return path("api", "runs", run_id, "steps", step.name)


# --------------------------------------------------------------------------- small records


@attrs.frozen
class Link:
    label: str
    url: str


@attrs.frozen
class RunRef:
    """A run id, with the URL of its page when it is a well-formed id."""

    id: str
    url: str | None
    status: str | None = None
    role: str | None = None


def run_ref(run_id: str, status: str | None = None, role: str | None = None) -> RunRef:
    try:
        parsed = q.parse_run_id(run_id)
    except InvalidArgument:
        return RunRef(run_id, None, status, role)
    return RunRef(parsed, path("runs", parsed), status, role)


@attrs.frozen
class SeqRef:
    """A seq shown as ``#N`` linking to the event, or a malformed placeholder, or nothing."""

    value: object
    url: str | None


def seq_ref(run_id: str, seq: object) -> SeqRef | None:
    if seq is None:
        return None
    if type(seq) is not int:
        return SeqRef(seq, None)
    page = url(path("runs", run_id), {"after": seq - 1 if seq > 0 else None})
    return SeqRef(seq, fragment(page, anchor(seq)))


@attrs.frozen
class Stored:
    """A stored JSON value: whole, or its cut beginning (``size`` characters in all) and where
    the rest is."""

    text: str
    truncated: bool
    size: int
    url: str | None


# --------------------------------------------------------------------------- runs page


@attrs.frozen
class RunRow:
    run: q.RunSummary
    ref: RunRef
    lease_state: str | None  # "active" / "expired"
    lease_note: str
    spend: str | None
    awaits: q.Awaiting | None
    awaits_more: int


@attrs.frozen
class Tab:
    label: str
    status_class: str
    count: int
    #: ``count`` is a lower bound (see ``q.STATUS_COUNT_CAP``).
    capped: bool
    url: str
    current: bool


def run_rows(
    runs: Iterable[q.RunSummary],
    awaiting: Mapping[str, tuple[q.Awaiting, ...]],
    budgets: Mapping[str, q.Usage],
    now: int,
) -> list[RunRow]:
    rows = []
    for run in runs:
        state, note = lease_state(run.lease_owner, run.lease_expires_at, now)
        items = awaiting.get(run.id, ())
        usage = budgets.get(run.id)
        rows.append(
            RunRow(
                run,
                run_ref(run.id),
                state,
                note,
                None if usage is None else q.spend_text(usage),
                items[0] if items else None,
                max(len(items) - 1, 0),
            )
        )
    return rows


def lease_state(owner: str | None, expires: object, now: int) -> tuple[str | None, str]:
    """("active" or "expired", "expires in 4 s") for a held lease; (None, "") otherwise."""
    if owner is None or expires is None or type(expires) is not int:
        return None, ""
    left = expires - now
    if left > 0:
        return "active", f"expires {human_delta(left)}"
    return "expired", f"expired {human_delta(left)}"


# --------------------------------------------------------------------------- run page


@attrs.frozen
class TreeNode:
    ref: RunRef
    children: tuple[TreeNode, ...]
    more: int


def tree_nodes(node: q.FamilyNode | None) -> tuple[TreeNode, ...]:
    if node is None:
        return ()
    return tuple(_tree_node(c) for c in node.children)


def _tree_node(node: q.FamilyNode) -> TreeNode:
    ref = run_ref(node.run.id, node.run.status, node.run.role)
    return TreeNode(ref, tuple(_tree_node(c) for c in node.children), node.more)


@attrs.frozen
class CheckpointView:
    row: q.CheckpointRow
    builds_on: str
    builds_on_url: str | None
    page_url: str
    api_url: str
    based_on: SeqRef | None
    decision: SeqRef | None
    state: Stored
    verification: Stored | None
    evidence: tuple[str, ...]
    passed: bool | None
    #: For a candidate: its verification was interrupted (it will never be decided by the
    #: attempt that proposed it), rather than maybe under way.
    interrupted: bool = False

    @property
    def undecided_note(self) -> str:
        if self.interrupted:
            return (
                "Undecided: its verification was interrupted (the verifier failed, or its owner"
                " stopped) and never decided it. An owner of the run finds it with"
                " pending_checkpoint() and can verify it again with verify_checkpoint()."
            )
        return "Undecided: its owner holds the run and may be verifying it now."


def lineage(checkpoints: Iterable[q.CheckpointRow]) -> dict[object, object]:
    """For each round, the accepted round it builds on (None: the original goal)."""
    builds_on: dict[object, object] = {}
    baseline: object = None
    for checkpoint in checkpoints:
        builds_on[checkpoint.round] = baseline
        if checkpoint.status == "accepted":
            baseline = checkpoint.round
    return builds_on


def checkpoint_views(run_id: str, checkpoints: Sequence[q.CheckpointRow]) -> list[CheckpointView]:
    builds = lineage(checkpoints)
    return [checkpoint_view(run_id, c, builds.get(c.round)) for c in checkpoints[:LIST_LIMIT]]


def checkpoint_view(run_id: str, c: q.CheckpointRow, builds_on: object) -> CheckpointView:
    api = checkpoint_api_url(run_id, c)
    verification = (
        None
        if c.verification is None
        else Stored(c.verification, c.verification_truncated, c.verification_size, api)
    )
    passed, evidence = verdict(c.verification, c.verification_truncated)
    return CheckpointView(
        c,
        "original goal" if builds_on is None else f"round {q.encode_key(builds_on)}",
        None if builds_on is None else checkpoint_page_url(run_id, builds_on),
        checkpoint_page_url(run_id, c.round),
        api,
        seq_ref(run_id, c.based_on_event_seq),
        seq_ref(run_id, c.decision_event_seq),
        Stored(c.state, c.state_truncated, c.state_size, api),
        verification,
        evidence,
        passed,
    )


def with_interruption(run: q.RunDetail, card: CheckpointView, now: int) -> CheckpointView:
    """A candidate's card says whether its verification was interrupted."""
    if card.row.status != "candidate":
        return card
    return attrs.evolve(card, interrupted=q.verification_interrupted(run, card.row, now))


def verdict(verification: str | None, truncated: bool) -> tuple[bool | None, tuple[str, ...]]:
    """The verifier's ``passed`` and its evidence lines, from a stored verification."""
    if verification is None or truncated:
        return None, ()
    ok, value = q.parse_json(verification)
    if not ok or not isinstance(value, dict):
        return None, ()
    passed = value.get("passed")
    evidence = value.get("evidence")
    lines: tuple[str, ...] = ()
    if isinstance(evidence, list):
        lines = tuple(e if isinstance(e, str) else pretty_value(e) for e in evidence[:50])
    elif isinstance(evidence, str):
        lines = (evidence,)
    return (passed if isinstance(passed, bool) else None), lines


#: Arguments of an approval request longer than this (pretty-printed) are not put on the page,
#: and no form decides them there: a decision is for arguments the person could read.
BOUND_ARGS_CHARS = 256 * 1024
#: The arguments of the open requests on one run page add up to this many characters at most;
#: the requests past it are listed without their arguments, and without a form.
APPROVALS_PAGE_CHARS = 4 * 1024 * 1024


@attrs.frozen
class ApprovalView:
    """An open approval request as the approve form shows it: every argument, or no form."""

    request: q.ApprovalRequest
    args: str | None  # all the arguments, pretty-printed; None: not shown, and no form
    size: int  # characters of ``args`` (as shown, escapes included)
    keys: tuple[str, ...]  # the top-level argument names, in the order shown
    refusal: str  # why there is no form ("" when there is one)


def approval_views(requests: Iterable[q.ApprovalRequest]) -> list[ApprovalView]:
    views = []
    budget = APPROVALS_PAGE_CHARS
    for request in requests:
        text = pretty_value(request.args)
        keys = tuple(request.args) if isinstance(request.args, dict) else ()
        elsewhere = (
            f"read them with `zincir approvals --run {request.run_id}` and decide with"
            f" `zincir approve {request.run_id} {request.call_id} --by NAME --hash {request.args_hash}`"
        )
        if len(text) > BOUND_ARGS_CHARS:
            refusal = (
                f"These arguments are {len(text):,} characters long, too long to show here in full,"
                f" so they cannot be decided here: {elsewhere}."
            )
            views.append(ApprovalView(request, None, len(text), keys, refusal))
        elif len(text) > budget:
            refusal = (
                "The arguments of the requests above fill this page: decide those first and reload,"
                f" or {elsewhere}."
            )
            views.append(ApprovalView(request, None, len(text), keys, refusal))
        else:
            budget -= len(text)
            views.append(ApprovalView(request, text, len(text), keys, ""))
    return views


@attrs.frozen
class BudgetRow:
    name: str
    spent: object
    limit: object
    left: object


def budget_rows(usage: q.Usage) -> list[BudgetRow]:
    return [BudgetRow(*line) for line in q.budget_lines(usage)]


def intent_class(state: str) -> str:
    return state.split(",")[0].replace(" ", "-")  # "started, outcome unknown" -> "started"
