"""docs/events.md documents the payload of every event type zincir writes: the types are exactly
EventType's, and the keys are exactly those real runs write (on both backends), so adding a type
or a key without documenting it, or documenting one nothing writes, fails here."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import attrs

import zincir

from .event_scenarios import every_event
from .helpers import REPO

DOC = REPO / "docs" / "events.md"


@attrs.frozen
class Documented:
    always: set[str]
    """Keys every event of the type carries."""
    sometimes: set[str]
    """Keys some events of the type carry."""
    nested: set[str]
    """Documented keys inside a value: ``parent.key`` and ``parent[].key``."""

    @property
    def top(self) -> set[str]:
        return self.always | self.sometimes


def documented() -> dict[str, Documented]:
    """Each event type of the page's ``### `type``` headings, with the keys of its table."""
    found: dict[str, Documented] = {}
    current: list[str] = []
    for line in DOC.read_text().splitlines():
        if line.startswith("### "):
            current = re.findall(r"`([a-z_]+)`", line)
            for name in current:
                assert name not in found, f"docs/events.md documents {name} twice"
                found[name] = Documented(set(), set(), set())
        elif (row := re.match(r"\| `([a-z_.\[\]]+)` \| (yes|no) \|", line)) and current:
            key, always = row.groups()
            for name in current:
                if "." in key:
                    found[name].nested.add(key)
                else:
                    (found[name].always if always == "yes" else found[name].sometimes).add(key)
    return found


def children(value: Any, parent: str) -> set[str]:
    """The keys one level inside ``value``, as the page writes them: ``parent.key`` for an object,
    ``parent[].key`` for the objects of a list (deeper levels are the caller's content)."""
    if isinstance(value, dict):
        return {f"{parent}.{key}" for key in value}
    if isinstance(value, list):
        return {f"{parent}[].{key}" for item in value if isinstance(item, dict) for key in item}
    return set()


def test_the_page_documents_exactly_the_event_types_zincir_has() -> None:
    assert set(documented()) == {t.value for t in zincir.EventType}
    for name, doc in documented().items():
        assert doc.always, f"docs/events.md: {name} has no key table"


async def test_real_runs_write_exactly_the_documented_keys(db: zincir.Database) -> None:
    events = await every_event(db)
    docs = documented()
    seen: dict[str, set[str]] = defaultdict(set)
    problems = []
    for event in events:
        kind, payload = event.type.value, event.payload
        doc = docs[kind]
        seen[kind] |= set(payload)
        if missing := doc.always - set(payload):
            problems.append(f"{kind} #{event.seq} lacks {sorted(missing)}, documented as always there")
        if unknown := set(payload) - doc.top:
            problems.append(f"{kind} #{event.seq} has undocumented keys {sorted(unknown)}: {payload}")
        # Inside the values the page describes key by key (not a user's content): those keys only.
        for parent in {key.split(".")[0].removesuffix("[]") for key in doc.nested}:
            if undocumented := children(payload.get(parent), parent) - doc.nested:
                problems.append(f"{kind} #{event.seq}: {sorted(undocumented)} are not documented")
    assert not problems, "\n".join(problems)
    # Every type is written by the runs, and every key documented is written by some event.
    assert set(seen) == set(docs), f"never written: {sorted(set(docs) - set(seen))}"
    for kind, doc in docs.items():
        assert doc.top == seen[kind], f"{kind}: documented but never written: {sorted(doc.top - seen[kind])}"
