"""Every large JSON value column is written and read through here (docs/payloads.md).

The columns that hold a JSON value of the user's (event payloads, step results, a run's config
and result, checkpoint states and verifications, stream chunks, signal payloads) store what
:func:`stored` returns for the value's JSON text, and every reader turns what it read back into
that JSON text with :func:`texts` (whole values) or :func:`cut_texts` (values cut to a prefix,
with SQL from :func:`shown_columns`). Nothing else reads or writes these columns' contents.

The interface, for a layer that changes how values are stored (encryption composes here, see
below):

- write: ``stored(tx, run_id, text, whole=...) -> str`` inside the operation's transaction
  (:class:`~zincir._store.Tx`); ``tx.payloads`` (:class:`Payloads`) carries the database's
  settings from :func:`~zincir.open_database`;
- read: ``texts(source, values) -> list`` and ``cut_texts(source, rows, columns, max_chars)``,
  batch functions over a transaction or a read-only connection: one query per batch of
  values, however many of them are references, so a page of a run's log costs one more query
  at most;
- a new run's config, stored before the run's row exists: ``stored_unreferenced`` and, once
  the row is written, ``refer``; a fork's copied columns keep their stored form (``copy_refs``).

The content store. A JSON text of at least ``Payloads.threshold`` characters is stored in parts:
each large part once, by its SHA-256, in ``payload_content``, and the column keeps a *reference
text*: ``@`` followed by a JSON array whose strings are literal text and whose one-element
arrays ``["<sha256 hex>"]`` stand for a stored part. The text is the parts joined. An event's
payload is an envelope (``{"call_id": ..., "content": <the tool's result>}``) whose envelope
differs every time, so its large *members* are the parts: the same result recorded by ten
calls is one row. A column that holds the user's value itself (``whole=True``: a step's result,
a config) is one part, so it is the same row as that value inside its event.

Why ``@`` is unambiguous: zincir writes these columns only with JSON text, and no JSON text
starts with ``@`` (a JSON value starts with ``{ [ " - t f n`` or a digit; zincir's encoder
writes no leading whitespace). A user's string that looks like a reference text is stored as a
JSON string, which starts with ``"``; a database written before the content store has only JSON
texts, read as they are.

Every part a run's columns use has a row (run_id, digest) in ``payload_refs``, which goes with
the run (ON DELETE CASCADE); the store's ``sweep_content`` deletes the parts no row refers to
any more (:mod:`zincir._store._content`).

Encryption at rest (``tx.sealer``, ``ReadOnly.sealer``: ``zincir/_crypto.py``). On the way in a
JSON text is split into parts first (the split needs the plaintext), then each stored part is
encrypted with the run's key (kind ``part``), and the column's text (the JSON text itself, or
its reference text with the literal stretches between the parts) is encrypted as a whole (kind
``value``). A part's digest is its ciphertext's: the nonce is derived from the text, so the same
part in the same run is the same row, stored once; another run's copy is another row (each run
has its own key, so that erasing one run's key erases its parts and nobody else's). On the way
out the reverse: the column is decrypted, then its parts are fetched and decrypted. An erased
run's value reads as :data:`~zincir._crypto.ERASED_TEXT` (storage operations) or
:data:`~zincir._crypto.ERASED_JSON` (the read-only queries).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs

from ._crypto import ENVELOPE, ERASED_JSON, ERASED_TEXT, PART, VALUE, Sealer, missing_key
from ._errors import InvalidArgument, StorageError
from ._sql import ReadOnly

if TYPE_CHECKING:
    from ._crypto import RunKey
    from ._store._tx import Tx

__all__ = [
    "DEFAULT_THRESHOLD",
    "MARK",
    "Payloads",
    "check_threshold",
    "copy_refs",
    "cut_texts",
    "parts_of",
    "refer",
    "resolved",
    "shown_columns",
    "shown_text",
    "stored",
    "stored_unreferenced",
    "texts",
]

DEFAULT_THRESHOLD: Final = 4096
"""JSON texts this long or longer (characters; zincir's JSON is ASCII, so bytes) are stored in parts."""

MARK: Final = "@"
"""The first character of a reference text (see the module's docstring for why it is unambiguous)."""


@attrs.frozen
class Payloads:
    """How one database stores its JSON values (set by :func:`~zincir.open_database`)."""

    threshold: int | None = DEFAULT_THRESHOLD
    """The content store's threshold in characters; None: every value is stored inline."""


def check_threshold(value: object) -> int | None:
    """``open_database(content_threshold=...)``: None or 0 turn the content store off."""
    if value is None or value == 0:
        return None
    if type(value) is not int or value < 64:
        raise InvalidArgument(f"content_threshold must be None, 0 or an int >= 64, not {value!r}")
    return value


# -- writing ------------------------------------------------------------------------------------


def stored(tx: Tx, run_id: str, text: str, *, whole: bool = False) -> str:
    """What a JSON value column of ``run_id`` stores for the JSON ``text``: ``text`` itself
    when it is short (the hot path: one comparison), else its reference text, with its parts
    stored and referenced by the run in ``tx``. ``whole``: the column holds the user's value
    itself (a step's result, a config), stored as one part; else the large members of an
    object or array are the parts (an event payload's envelope stays inline)."""
    threshold = tx.payloads.threshold
    sealer = tx.sealer
    if sealer is not None:
        column, digests = _store_sealed(tx, sealer, run_id, None, text, threshold, whole)
    elif threshold is None or len(text) < threshold:
        return text
    else:
        column, digests = _store_parts(tx, text, threshold, whole)
    refer(tx, run_id, digests)
    return column


@attrs.frozen
class Unreferenced:
    """What a new run must :func:`refer` to once its row exists: the stored parts of its config,
    and (encrypted) its new key, stored with it."""

    digests: tuple[str, ...] = ()
    key: RunKey | None = None


def stored_unreferenced(tx: Tx, text: str, run_id: str) -> tuple[str, Unreferenced]:
    """:func:`stored` (``whole=True``) for a run whose row is not written yet (its config):
    the column's text, and what the run must :func:`refer` to once its row exists (a reference
    names an existing run; a spawn repeated after a restart writes no row, nor key)."""
    threshold = tx.payloads.threshold
    sealer = tx.sealer
    if sealer is not None:
        key = sealer.fresh(run_id)
        column, digests = _store_sealed(tx, sealer, run_id, key, text, threshold, True)
        return column, Unreferenced(digests, key)
    if threshold is None or len(text) < threshold:
        return text, Unreferenced()
    column, digests = _store_parts(tx, text, threshold, True)
    return column, Unreferenced(digests)


def _store_parts(
    tx: Tx, text: str, threshold: int, whole: bool, seal: Callable[[str], str] | None = None
) -> tuple[str, tuple[str, ...]]:
    """Store ``text``'s large parts (each as ``seal`` gives it, when encrypted: a part's digest
    is then its ciphertext's); its reference text (or ``text``: none) and their digests."""
    pieces: list[Any] = []
    large: dict[str, tuple[str, int]] = {}
    for part in parts_of(text, threshold, whole=whole):
        if isinstance(part, str):
            pieces.append(part)
            continue
        body = part.text if seal is None else seal(part.text)
        digest = hashlib.sha256(body.encode()).hexdigest()
        large[digest] = (body, len(part.text))
        pieces.append([digest])
    if not large:
        return text, ()
    _put(tx, large)
    return MARK + json.dumps(pieces, separators=(",", ":")), tuple(large)


def _store_sealed(
    tx: Tx, sealer: Sealer, run_id: str, key: RunKey | None, text: str, threshold: int | None, whole: bool
) -> tuple[str, tuple[str, ...]]:
    """:func:`_store_parts` on an encrypted database: the parts are encrypted (and digested as
    ciphertext), then the column's text is. ``key``: a new run's, not stored yet."""
    if threshold is None or len(text) < threshold:
        return sealer.seal(tx, run_id, VALUE, text, key), ()
    column, digests = _store_parts(
        tx, text, threshold, whole, lambda part: sealer.seal(tx, run_id, PART, part, key)
    )
    return sealer.seal(tx, run_id, VALUE, column, key), digests


@attrs.frozen
class _Part:
    """A stretch of the JSON text stored once, by its digest."""

    text: str


def parts_of(text: str, threshold: int, *, whole: bool) -> list[str | _Part]:
    """``text`` as literal strings and :class:`_Part` stretches, joined in order. A text that
    is not JSON (nothing zincir writes) is one part: it round-trips all the same."""
    if whole or text[:1] not in ("{", "["):
        return [_Part(text)]
    try:
        spans = _member_spans(text)
    except ValueError:
        return [_Part(text)]
    parts: list[str | _Part] = []
    at = 0
    for start, end in spans:
        if end - start >= threshold:
            parts.extend((text[at:start], _Part(text[start:end])))
            at = end
    if not parts:
        return [_Part(text)]  # large only as a whole: many small members
    parts.append(text[at:])
    return [p for p in parts if not isinstance(p, str) or p]


_DECODER: Final = json.JSONDecoder()
_SPACE: Final = re.compile(r"[ \t\n\r]*")


def _member_spans(text: str) -> list[tuple[int, int]]:
    """Where each member value of the object or array ``text`` starts and ends (ValueError
    when ``text`` is not one JSON object or array). The C scanner finds each value's end."""
    spans: list[tuple[int, int]] = []
    closing = "}" if text[0] == "{" else "]"
    at = _SPACE.match(text, 1).end()  # type: ignore[union-attr]
    if text[at : at + 1] == closing:
        return spans
    while True:
        if closing == "}":
            _, at = json.decoder.scanstring(text, at + 1)  # type: ignore[attr-defined]
            at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
            if text[at : at + 1] != ":":
                raise ValueError("expected ':'")
            at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
        _, end = _DECODER.raw_decode(text, at)
        spans.append((at, end))
        at = _SPACE.match(text, end).end()  # type: ignore[union-attr]
        mark = text[at : at + 1]
        if mark == closing:
            if text[at + 1 :].strip():
                raise ValueError("text after the value")
            return spans
        if mark != ",":
            raise ValueError("expected ','")
        at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]


def _put(tx: Tx, large: dict[str, tuple[str, int]]) -> None:
    """Store each part once; nothing here is read, so on PostgreSQL it costs no round trip.
    The caller's :func:`refer` keeps them (in the same transaction: see Dialect.content_guard)."""
    d = tx.dialect
    if d.content_guard:
        tx.execute(d.content_guard)  # see Dialect.content_guard: a sweep never races this write
    for digest, (body, size) in large.items():
        tx.execute(
            "INSERT INTO payload_content (digest, body, size, created_at) VALUES (?, ?, ?, :now)"
            " ON CONFLICT (digest) DO NOTHING",
            (digest, body, size),
        )


def refer(tx: Tx, run_id: str, digests: Sequence[str] | Unreferenced) -> None:
    """Note that run ``run_id`` (its row written) uses the stored parts ``digests`` (and, for
    a new run's :class:`Unreferenced`, store its key)."""
    if isinstance(digests, Unreferenced):
        if digests.key is not None and tx.sealer is not None:
            tx.sealer.store(tx, run_id, digests.key)
        digests = digests.digests
    for digest in digests:
        tx.execute(
            "INSERT INTO payload_refs (run_id, digest) VALUES (?, ?) ON CONFLICT (run_id, digest) DO NOTHING",
            (run_id, digest),
        )


def copy_refs(tx: Tx, source_id: str, run_id: str) -> None:
    """``run_id`` (a fork) refers to every part ``source_id`` refers to: copied columns keep
    their parts alive after the source is deleted. All of them, not only the copied prefix's:
    one statement, and a part the fork never reads is kept only as long as the fork is."""
    tx.execute(
        "INSERT INTO payload_refs (run_id, digest) SELECT ?, digest FROM payload_refs WHERE run_id = ?"
        " ON CONFLICT (run_id, digest) DO NOTHING",
        (run_id, source_id),
    )


# -- reading ------------------------------------------------------------------------------------


def _fetch(source: Any, digests: Sequence[str], body: str) -> dict[str, tuple[str, int]]:
    """``body`` (an SQL expression of the part's text) and size of each stored part (opened,
    when encrypted)."""
    d = source.dialect
    found: dict[str, tuple[str, int]] = {}
    for chunk in d.chunks(list(digests)):
        where, params = d.any_of("digest", chunk)
        sql = f"SELECT digest, {body}, size FROM payload_content WHERE {where}"
        rows = source.execute(sql, params) if isinstance(source, ReadOnly) else source.all(sql, params)
        for digest, text, size in rows:
            found[digest] = (text, int(size))
    bodies = [text for text, _ in found.values()]
    if _any_sealed(bodies):
        opened = _opened(source, bodies, PART)
        found = {
            digest: (text, size) for (digest, (_, size)), text in zip(found.items(), opened, strict=True)
        }
    return found


def _sealer(source: Any) -> Sealer | None:
    sealer: Sealer | None = source.sealer
    return sealer


def _opened(source: Any, values: Sequence[Any], kind: str = VALUE) -> list[Any]:
    """``values`` with each encrypted one decrypted (one key lookup per run); an erased run's
    as :data:`ERASED_TEXT` in a transaction, :data:`ERASED_JSON` on a read-only connection."""
    out = list(values)
    sealer = _sealer(source)
    keys: dict[str, RunKey | None] = {}
    if isinstance(source, ReadOnly):
        erased = ERASED_JSON

        def fetch(sql: str, params: Sequence[Any]) -> Any:
            return source.execute(sql, params).fetchone()
    else:
        erased, fetch = ERASED_TEXT, source.one
    for i, value in enumerate(values):
        if isinstance(value, str) and value.startswith(ENVELOPE):
            if sealer is None:
                raise missing_key()
            text = sealer.open(keys, fetch, kind, value)
            out[i] = erased if text == ERASED_TEXT else text
    return out


def _any_sealed(values: Sequence[Any]) -> bool:
    """Whether some of ``values`` are encrypted. Looked at without a key too (a prefix test per
    value): a database opened before another process turned encryption on reads such a value
    as a missing key, never as a JSON error."""
    return any(isinstance(v, str) and v.startswith(ENVELOPE) for v in values)


def _parsed(value: object) -> list[Any] | None:
    """The parts of a reference text, or None for any other value (a JSON text, NULL, and
    whatever else a column may hold)."""
    if not isinstance(value, str) or not value.startswith(MARK):
        return None
    try:
        parts = json.loads(value[1:])
    except (ValueError, RecursionError):
        return None
    if not isinstance(parts, list) or not all(isinstance(p, str) or _is_ref(p) for p in parts):
        return None  # not one zincir wrote: shown as it is
    return parts


def _is_ref(part: object) -> bool:
    return isinstance(part, list) and len(part) == 1 and isinstance(part[0], str)


def _digests(parsed: Sequence[list[Any] | None]) -> set[str]:
    return {p[0] for parts in parsed if parts for p in parts if isinstance(p, list) and p}


def texts(source: Any, values: Sequence[Any]) -> list[Any]:
    """The JSON texts behind ``values`` read from JSON value columns (in a transaction, or on a
    read-only connection), in order, with one query for all their parts. Anything that is not
    a reference text comes back as it is (None included). A missing part is a
    :class:`StorageError`: the database lost a value it promised to keep."""
    found = _texts(source, values)
    return list(values) if found is None else found


def _texts(source: Any, values: Sequence[Any]) -> list[Any] | None:
    """:func:`texts`, or None when every value is one already (the common case: nothing
    encrypted, nothing stored in parts), so that a caller keeps what it has."""
    sealed = _any_sealed(values)
    if sealed:
        values = _opened(source, values)
    parsed = [_parsed(v) for v in values]
    wanted = _digests(parsed)
    if not wanted:
        return list(values) if sealed else None
    found = _fetch(source, sorted(wanted), "body")
    missing = wanted - found.keys()
    if missing:
        raise StorageError(f"stored payload part {min(missing)} is missing (docs/payloads.md)")
    return [v if parts is None else _joined(parts, found) for v, parts in zip(values, parsed, strict=True)]


def resolved(source: Any, rows: Sequence[Sequence[Any]], columns: Sequence[int]) -> list[Any]:
    """``rows`` with the values at ``columns`` read by :func:`texts` (one query for all); the
    rows as they are when none of those values is encrypted or in parts (every event read's
    path: no row is copied)."""
    if not rows:
        return list(rows)
    values = _texts(source, [row[c] for row in rows for c in columns])
    if values is None:
        return list(rows)
    out = []
    width = len(columns)
    for i, row in enumerate(rows):
        row = list(row)
        for j, c in enumerate(columns):
            row[c] = values[i * width + j]
        out.append(tuple(row))
    return out


def _joined(parts: Sequence[Any], found: dict[str, tuple[str, int]]) -> str:
    return "".join(p if isinstance(p, str) else found[p[0]][0] for p in parts)


def shown_columns(column: str, max_chars: int | None) -> str:
    """SQL for a JSON value column cut to ``max_chars`` characters, then its stored length:
    a reference text is read whole (it is short), so that :func:`cut_texts` can resolve it."""
    return f"{shown_text(column, max_chars)}, length({column})"


def shown_text(column: str, max_chars: int | None) -> str:
    """:func:`shown_columns` without the length (a column after it stands in for that)."""
    if max_chars is None:
        return column
    cut = max(0, int(max_chars))
    whole = f"substr({column}, 1, 1) = '{MARK}' OR substr({column}, 1, {len(ENVELOPE)}) = '{ENVELOPE}'"
    return f"CASE WHEN {whole} THEN {column} ELSE substr({column}, 1, {cut}) END"


def cut_texts(
    source: Any, rows: Sequence[Sequence[Any]], columns: Sequence[int], max_chars: int | None
) -> list[Any]:
    """``rows`` read with :func:`shown_columns` at the indexes ``columns`` (each the shown text,
    the next its length), with each reference text replaced by its text cut to ``max_chars``
    and its length: one query for the whole page. Never raises (the read queries' contract):
    a part that is missing leaves its reference text shown. An encrypted value is opened (read
    whole: the database cannot cut it), its length then the plaintext's."""
    if _any_sealed([row[c] for row in rows for c in columns]):
        rows = _opened_rows(source, rows, columns)
        if max_chars is not None:  # opened whole: cut here, as the SQL cuts a clear value
            rows = [
                tuple(_cut(v, max_chars) if c in columns and not _marked(v) else v for c, v in enumerate(row))
                for row in rows
            ]
    marked = {(i, c): _parsed(row[c]) for i, row in enumerate(rows) for c in columns if _marked(row[c])}
    if not marked:  # the common case: every value inline, cut by the SQL already
        return list(rows)
    wanted = _digests(list(marked.values()))
    cuttable = max_chars is not None and _sealer(source) is None
    body = f"substr(body, 1, {max(0, int(max_chars or 0))})" if cuttable else "body"
    found = _fetch(source, sorted(wanted), body) if wanted else {}
    out = [list(row) for row in rows]
    for (i, c), parts in marked.items():
        if parts is not None and _digests([parts]) <= found.keys():
            out[i][c], out[i][c + 1] = _prefix(parts, found, max_chars)
        elif max_chars is not None:  # not a reference text zincir wrote: cut as any text
            out[i][c] = out[i][c][: max(0, int(max_chars))]
    return [tuple(row) for row in out]


def _marked(value: object) -> bool:
    return isinstance(value, str) and value.startswith(MARK)


def _prefix(
    parts: Sequence[Any], found: dict[str, tuple[str, int]], max_chars: int | None
) -> tuple[str, int]:
    size = sum(len(p) if isinstance(p, str) else found[p[0]][1] for p in parts)
    text = _joined(parts, found)
    return (text if max_chars is None else text[: max(0, int(max_chars))]), size


def _cut(value: Any, max_chars: int) -> Any:
    return value[: max(0, int(max_chars))] if isinstance(value, str) else value


def _opened_rows(source: Any, rows: Sequence[Sequence[Any]], columns: Sequence[int]) -> list[Any]:
    """``rows`` read with :func:`shown_columns` with their encrypted values opened, whole; the
    length after each is the plaintext's (a reference text's is computed from its parts)."""
    values = _opened(source, [row[c] for row in rows for c in columns])
    out = []
    for i, row in enumerate(rows):
        changed = list(row)
        for j, c in enumerate(columns):
            value = values[i * len(columns) + j]
            if value is not row[c]:
                changed[c] = value
                changed[c + 1] = len(value)
        out.append(tuple(changed))
    return out
