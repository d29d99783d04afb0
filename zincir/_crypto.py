"""Encryption at rest: every run's payloads under a key of its own, and erasure by deleting it.

Envelope encryption (docs/payloads.md#encryption-and-erasure). Each run gets a random 256-bit
data key when it is created, stored in ``run_keys`` wrapped (AES-GCM) by a master key the
application holds (``open_database(..., encryption_key=...)`` or ``keys=``). The JSON value
columns (events' payloads, configs, results, steps' results, checkpoints, signals' payloads,
stream chunks), and the parts the content store keeps of them, hold an envelope instead of
text; ``zincir/_payloads.py`` is the one place that writes and reads them::

    zc1:<run id>:<base64url(nonce || AES-GCM(data key, text, aad = run id | kind))>

The run id in the envelope names the key, so a value copied into a fork (docs/forks.md) stays
readable through the run it came from, and erasing that run erases the copies too. The run in
the associated data means a value moved to another run does not decrypt; the kind (a column's
value, or a stored part) that a part cannot stand in for a value. The nonce is derived from
the text (an HMAC under a key derived from the data key), so the same value in the same run
encrypts the same way, and the content store keeps one copy of it; two different values never
share a nonce.

Erasure (``erase_run``) deletes the wrapped key: from then on every envelope of the run reads as
erased, for every process (a read looks the key row up each time). Rotation (``rotate_keys``)
re-wraps the data keys under the current master key; the payloads are not touched.

Ids, types, seqs, times, names, statuses and leases stay in clear: leases, claims and recovery
never decrypt anything.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, final, runtime_checkable

from ._errors import (
    EncryptionError,
    EncryptionKeyInvalid,
    EncryptionKeyMissing,
    EncryptionUnavailable,
    InvalidArgument,
    RunErased,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from ._store._tx import Tx

__all__ = [
    "ENVELOPE",
    "ERASED",
    "ERASED_JSON",
    "ERASED_TEXT",
    "PART",
    "VALUE",
    "Erased",
    "KeyProvider",
    "KeyRing",
    "RunKey",
    "Sealer",
    "check_readonly_keys",
    "key_provider",
    "keys_from_env",
    "missing_key",
    "parse_key",
]

ENVELOPE: Final = "zc1:"
"""How an encrypted value starts. No JSON text starts so, so a reader tells the two apart."""

ERASED_TEXT: Final = "\x00erased"
"""What :func:`unseal` gives for a value of an erased run: never JSON (JSON has no raw NUL)."""

KEY_BYTES: Final = 32
_NONCE_BYTES: Final = 12
_CHECK_TEXT: Final = b"zincir master key check"
_RUN_KEYS_CACHED: Final = 4096
"""Data keys kept unwrapped in memory, most recently used first (about 200 bytes each)."""


@final
class Erased(dict[str, Any]):
    """The value of an erased run's payload (``zincir.ERASED``): an empty mapping, so that code
    that looks into it finds nothing rather than failing, and ``value is zincir.ERASED`` tells."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<erased>"

    def _unchangeable(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("an erased payload cannot be changed")

    __setitem__ = __delitem__ = __ior__ = _unchangeable
    update = setdefault = pop = popitem = clear = _unchangeable


ERASED: Final = Erased()


def _aesgcm(key: bytes) -> AESGCM:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise EncryptionUnavailable(
            "encryption at rest needs the cryptography package: pip install 'zincir[crypto]'"
        ) from None
    return AESGCM(key)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# -- master keys ------------------------------------------------------------------------------


@runtime_checkable
class KeyProvider(Protocol):
    """Where the master keys come from (a key ring in memory, a KMS, a vault): the id of the key
    that wraps new runs' keys, and each key by its id. A key is 32 bytes (AES-256)."""

    @property
    def current_key_id(self) -> str: ...

    def key(self, key_id: str) -> bytes | None:
        """The master key with this id, or None when this provider does not have it."""


def key_id_of(key: bytes) -> str:
    """A master key's id as :class:`KeyRing` names it: a hash of it, which tells nothing of it."""
    return "k" + hashlib.sha256(b"zincir master key id\x00" + key).hexdigest()[:16]


def _check_key(key: object, what: str) -> bytes:
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise InvalidArgument(f"{what} must be {KEY_BYTES} bytes (an AES-256 key), not {type(key).__name__}")
    return key


@final
class KeyRing:
    """Master keys held in memory: ``current`` wraps the keys of new runs (and every key after
    ``zincir.rotate_keys``); ``previous`` ones still unwrap the keys they wrapped before. Each
    key's id is a hash of it, so the same bytes always have the same id."""

    def __init__(self, current: bytes, previous: Iterable[bytes] = ()) -> None:
        self._current = key_id_of(_check_key(current, "the current key"))
        self._keys = {self._current: current}
        for old in previous:
            self._keys.setdefault(key_id_of(_check_key(old, "a previous key")), old)

    def __repr__(self) -> str:
        return f"<zincir.KeyRing current={self._current} keys={len(self._keys)}>"

    @property
    def current_key_id(self) -> str:
        return self._current

    def key(self, key_id: str) -> bytes | None:
        return self._keys.get(key_id)


def parse_key(text: str) -> bytes:
    """A 32-byte key written as text: 64 hex digits, or base64 (standard or URL-safe)."""
    text = text.strip()
    try:
        key = (
            bytes.fromhex(text)
            if len(text) == 2 * KEY_BYTES
            else _unb64(text.replace("+", "-").replace("/", "_"))
        )
    except (ValueError, binascii.Error):
        key = b""
    if len(key) != KEY_BYTES:
        raise InvalidArgument(f"an encryption key is {KEY_BYTES} bytes written as 64 hex digits or base64")
    return key


def key_provider(encryption_key: bytes | None, keys: KeyProvider | None) -> KeyProvider | None:
    """What ``open_database``'s ``encryption_key`` and ``keys`` ask for (None: no encryption)."""
    if encryption_key is not None and keys is not None:
        raise InvalidArgument("give encryption_key or keys, not both")
    if encryption_key is not None:
        return KeyRing(encryption_key)
    if keys is None:
        return None
    if not isinstance(keys, KeyProvider):
        raise InvalidArgument(f"keys must be a zincir.KeyRing or a KeyProvider, not {type(keys).__name__}")
    return keys


# -- the sealer -------------------------------------------------------------------------------


@final
class RunKey:
    """A run's data key, unwrapped: the cipher, and the key its nonces are derived with."""

    __slots__ = ("aead", "key_id", "nonces", "wrapped")

    def __init__(self, dek: bytes, key_id: str, wrapped: str) -> None:
        self.aead = _aesgcm(dek)
        self.nonces = hmac.new(dek, b"zincir nonce key", hashlib.sha256).digest()
        self.key_id = key_id
        self.wrapped = wrapped


Fetch = Callable[[str, Sequence[Any]], Any]
"""How the sealer reads a row: ``fetch(sql, params)`` gives the first row or None."""

_KEY_ROW: Final = "SELECT key_id, wrapped_dek FROM run_keys WHERE run_id = ?"


@final
class Sealer:
    """A database's encryption: its key provider, and the data keys it has unwrapped. Shared by
    the database's threads (a lock guards the caches)."""

    def __init__(self, provider: KeyProvider) -> None:
        self.provider = provider
        self._masters: dict[str, AESGCM] = {}
        self._runs: OrderedDict[str, RunKey] = OrderedDict()
        self._lock = threading.Lock()
        _aesgcm(bytes(KEY_BYTES))  # EncryptionUnavailable now, not at the first write

    # master keys

    def _master(self, key_id: str) -> AESGCM:
        with self._lock:
            found = self._masters.get(key_id)
        if found is not None:
            return found
        key = self.provider.key(key_id)
        if key is None:
            raise EncryptionKeyMissing(
                f"the key provider has no master key {key_id!r}, which this data needs"
            )
        aead = _aesgcm(_check_key(key, f"master key {key_id!r}"))
        with self._lock:
            self._masters[key_id] = aead
        return aead

    def check_value(self, key_id: str) -> str:
        """A known text encrypted with the master key ``key_id``: what tells a wrong key."""
        nonce = os.urandom(_NONCE_BYTES)
        return _b64(nonce + self._master(key_id).encrypt(nonce, _CHECK_TEXT, key_id.encode()))

    def verify(self, key_id: str, check_value: str) -> None:
        """EncryptionKeyInvalid unless the provider's key ``key_id`` made ``check_value``."""
        if not self._opens(self._master(key_id), check_value, key_id.encode()):
            raise EncryptionKeyInvalid(
                f"master key {key_id!r} is not the key this database was encrypted with"
            )

    @staticmethod
    def _opens(aead: AESGCM, text: str, aad: bytes) -> bytes | None:
        from cryptography.exceptions import InvalidTag

        try:
            data = _unb64(text)
            return aead.decrypt(data[:_NONCE_BYTES], data[_NONCE_BYTES:], aad)
        except (InvalidTag, ValueError, binascii.Error):
            return None

    def wrap(self, run_id: str, dek: bytes) -> tuple[str, str]:
        """(key id, wrapped key): ``dek`` encrypted with the current master key, bound to the run."""
        key_id = self.provider.current_key_id
        nonce = os.urandom(_NONCE_BYTES)
        return key_id, _b64(nonce + self._master(key_id).encrypt(nonce, dek, _wrap_aad(run_id)))

    def unwrap(self, run_id: str, key_id: str, wrapped: str) -> bytes:
        dek = self._opens(self._master(key_id), wrapped, _wrap_aad(run_id))
        if dek is None:
            raise EncryptionKeyInvalid(
                f"run {run_id}: its key does not open with master key {key_id!r} (a wrong key, or altered)"
            )
        return dek

    # run keys

    def fresh(self, run_id: str) -> RunKey:
        """A new data key for ``run_id``, wrapped, not stored yet (:meth:`store`)."""
        dek = os.urandom(KEY_BYTES)
        return RunKey(dek, *self.wrap(run_id, dek))

    def store(self, tx: Tx, run_id: str, key: RunKey) -> None:
        """Store a new run's key, in the transaction that creates the run (the row's reference
        to the run is checked at COMMIT, so it may come first)."""
        _insert_key(tx, run_id, key)
        self._remember(run_id, key)

    def _remember(self, run_id: str, key: RunKey) -> None:
        with self._lock:
            self._runs[run_id] = key
            self._runs.move_to_end(run_id)
            while len(self._runs) > _RUN_KEYS_CACHED:
                self._runs.popitem(last=False)

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def forget_all(self) -> None:
        with self._lock:
            self._runs.clear()

    def _cached(self, run_id: str) -> RunKey | None:
        with self._lock:
            return self._runs.get(run_id)

    def _load(self, run_id: str, row: Any) -> RunKey | None:
        """The key of ``row`` (key_id, wrapped_dek); None: erased."""
        key_id, wrapped = row
        if wrapped is None:
            self.forget(run_id)
            return None
        cached = self._cached(run_id)
        if cached is not None and cached.wrapped == wrapped:
            return cached
        key = RunKey(self.unwrap(run_id, key_id, wrapped), key_id, wrapped)
        self._remember(run_id, key)
        return key

    def writing_key(self, tx: Tx, run_id: str) -> RunKey:
        """The key a write of the run's encrypts with. A live run's key (a run being written)
        cannot be erased, so a cached key is used as it is; a run from before encryption was
        turned on gets its key now."""
        cached = self._cached(run_id)
        if cached is not None:
            return cached
        row = tx.one(_KEY_ROW, (run_id,))
        if row is None:
            new = self.fresh(run_id)
            _insert_key(tx, run_id, new)
            return new  # remembered once committed, at its next read
        key = self._load(run_id, row)
        if key is None:
            raise RunErased(f"run {run_id} was erased: nothing can be written for it")
        return key

    def reading_key(self, fetch: Fetch, run_id: str) -> RunKey | None:
        """The key of a run, read now (so an erasure by any process is seen at once); None:
        erased."""
        row = fetch(_KEY_ROW, (run_id,))
        if row is None:
            raise EncryptionKeyMissing(f"run {run_id} has encrypted values and no key row")
        return self._load(run_id, row)

    # values

    def seal(self, tx: Tx, run_id: str, kind: str, text: str, key: RunKey | None = None) -> str:
        """``text`` encrypted as a ``kind`` (:data:`VALUE`, :data:`PART`) of ``run_id`` (with
        ``key``, a new run's key not stored yet, or the run's)."""
        if key is None:
            key = self.writing_key(tx, run_id)
        aad = _aad(run_id, kind)
        data = text.encode()
        nonce = hmac.new(key.nonces, aad + data, hashlib.sha256).digest()[:_NONCE_BYTES]
        return f"{ENVELOPE}{run_id}:{_b64(nonce + key.aead.encrypt(nonce, data, aad))}"

    def open(self, keys: dict[str, RunKey | None], fetch: Fetch, kind: str, text: str) -> str:
        """The JSON text of an envelope (:data:`ERASED_TEXT` for an erased run's); ``keys``: the
        run keys this read has looked up so far (one lookup per run and read)."""
        run_id, _, sealed = text[len(ENVELOPE) :].rpartition(":")
        if run_id in keys:
            key = keys[run_id]
        else:
            key = self.reading_key(fetch, run_id)
            keys[run_id] = key
        if key is None:
            return ERASED_TEXT
        data = self._opens(key.aead, sealed, _aad(run_id, kind))
        if data is None:
            raise EncryptionKeyInvalid(f"run {run_id}: a stored {kind} does not decrypt (altered, or moved)")
        return data.decode()


def _insert_key(tx: Tx, run_id: str, key: RunKey) -> None:
    tx.execute(
        "INSERT INTO run_keys (run_id, key_id, wrapped_dek, created_at) VALUES (?, ?, ?, :now)",
        (run_id, key.key_id, key.wrapped),
    )


def _aad(run_id: str, kind: str) -> bytes:
    return f"zincir|{run_id}|{kind}".encode()


def _wrap_aad(run_id: str) -> bytes:
    return f"zincir run key|{run_id}".encode()


# -- what the storage operations and the content store call -----------------------------------


def missing_key() -> EncryptionError:
    """The error of an encrypted value read without a key."""
    return EncryptionKeyMissing(
        "a stored value is encrypted and no key was given: open the database with"
        " encryption_key=... or keys=... (the CLI and the inspector: ZINCIR_ENCRYPTION_KEY or"
        " ZINCIR_ENCRYPTION_KEY_FILE)"
    )


# What a ciphertext is, as its associated data names it (with its run): a column's value, or a
# part of one that the content store keeps (zincir/_payloads.py).
VALUE: Final = "value"
PART: Final = "part"


ERASED_JSON: Final = '{"erased":true}'
"""What the read-only queries (the CLI, the inspector) show for a value of an erased run (the
run itself says so too: its ``erased_at``)."""


# -- keys for the CLI and the inspector ----------------------------------------------------------

KEY_ENV: Final = "ZINCIR_ENCRYPTION_KEY"
"""The master key as text (64 hex digits or base64); several, comma-separated: the first is
the current one, the others previous ones (during a rotation)."""
KEY_FILE_ENV: Final = "ZINCIR_ENCRYPTION_KEY_FILE"
"""A file holding the master key(s) as text, one a line, the current one first."""


def keys_from_env() -> KeyRing | None:
    """The master keys the environment gives the CLI and the inspector (None: none)."""
    text = os.environ.get(KEY_ENV)
    if not text:
        path = os.environ.get(KEY_FILE_ENV)
        if not path:
            return None
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except OSError as exc:
            raise InvalidArgument(f"{KEY_FILE_ENV}: cannot read {path!r}: {exc.strerror}") from None
    keys = [parse_key(part) for part in text.replace(",", "\n").split() if part.strip()]
    if not keys:
        return None
    return KeyRing(keys[0], keys[1:])


def check_readonly_keys(sealer: Sealer, fetch_all: Callable[[str], list[Any]]) -> None:
    """:func:`zincir._store._keys.prepare_keys`'s checks, read-only: EncryptionKeyInvalid when
    the keys given are not the database's."""
    provider = sealer.provider
    used = [row[0] for row in fetch_all("SELECT DISTINCT key_id FROM run_keys WHERE key_id IS NOT NULL")]
    if used and all(provider.key(key_id) is None for key_id in used):
        raise EncryptionKeyInvalid("the key given is not the one this database was encrypted with")
    for key_id, check_value in fetch_all("SELECT key_id, check_value FROM encryption_keys"):
        if provider.key(key_id) is not None:
            sealer.verify(key_id, check_value)
