"""Artifacts bound to content: record what an agent produced, not what it says it produced.

An agent's checkpoint can name its artifacts with labels ("wrote report.md"), but a label
proves nothing. :func:`identify` measures a path instead: a file's SHA-256, a directory
tree's SHA-256 over its relative paths and contents, or, for a git workspace, the commit it
is at plus a hash of its uncommitted changes. Put ``artifact.to_json()`` into
:attr:`CheckpointState.artifacts`; a verifier then calls :func:`mismatches` to check that
every artifact still has the content that was measured. A label left among them is reported
as unverified (kind ``label``): a verifier that accepts only when :func:`mismatches` is empty
never accepts the model's own words for an artifact.

Hashing reads files in a worker thread, so these functions are async and never block Trio.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from ._errors import InvalidArgument
from ._json import dump_trusted

__all__ = ["Artifact", "identify", "mismatches"]

_CHUNK = 1 << 20


@attrs.frozen
class Artifact:
    """The measured identity of a file, a directory tree, or a git workspace; or, as
    :func:`mismatches` reports it, a label that was never measured (kind ``label``, the label as
    its ``path``, no hash)."""

    kind: Literal["file", "tree", "git", "missing", "label"]
    path: str
    sha256: str
    """Of the file, of the tree, or of the workspace's uncommitted changes."""
    commit: str | None = None
    """For a git workspace: the commit HEAD points at."""

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Artifact:
        try:
            return cls(value["kind"], value["path"], value["sha256"], value.get("commit"))
        except (KeyError, TypeError):
            raise InvalidArgument(f"not an artifact identity: {value!r}") from None


async def identify(path: str | os.PathLike[str]) -> Artifact:
    """Measure what is at ``path`` now (a missing path is measured as ``missing``).

    Raises :class:`InvalidArgument` when it cannot be measured (unreadable, or a git
    workspace whose state git cannot report).
    """
    try:
        return await trio.to_thread.run_sync(_identify, Path(path))
    except (OSError, subprocess.SubprocessError) as exc:
        raise InvalidArgument(f"cannot measure the artifact at {os.fspath(path)!r}: {exc}") from None


async def mismatches(artifacts: Iterable[Artifact | Mapping[str, Any] | str]) -> list[Artifact]:
    """The artifacts that do not verify, in order: those whose content is no longer what was
    measured, those that were missing when measured, and every label (a plain string: the
    model's own words, with nothing measured behind them), reported as ``Artifact("label",
    <the label>, "")``; any other value that is not a measured identity is reported the same
    way, with its JSON as the label. Empty: every artifact was measured and still has that
    content.
    """
    unverified = []
    for item in artifacts:
        recorded = _measured(item)
        if recorded is None:
            unverified.append(Artifact("label", _label(item), ""))
        elif recorded.kind in ("missing", "label") or await identify(recorded.path) != recorded:
            unverified.append(recorded)
    return unverified


def _label(item: object) -> str:
    if isinstance(item, str):
        return item
    try:
        return dump_trusted(item)
    except (TypeError, ValueError):  # not JSON at all (not from a stored checkpoint)
        return repr(item)


def _measured(item: object) -> Artifact | None:
    """``item`` as a measured identity, or None if it is none (a label, or anything else)."""
    if isinstance(item, Artifact):
        return item
    if not isinstance(item, Mapping):
        return None
    try:
        recorded = Artifact.from_json(item)
    except InvalidArgument:
        return None
    fields = (recorded.path, recorded.sha256)
    return recorded if all(isinstance(f, str) for f in fields) else None


def _identify(path: Path) -> Artifact:
    shown = str(path)
    if path.is_file():
        return Artifact("file", shown, _file_sha256(path))
    if path.exists() and not path.is_dir():
        raise OSError(f"{shown} is neither a regular file nor a directory")
    if path.is_dir():
        if (path / ".git").exists():
            commit, changes = _git_state(path)
            return Artifact("git", shown, changes, commit)
        return Artifact("tree", shown, _tree_sha256(path))
    return Artifact("missing", shown, "")


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _tree_sha256(root: Path) -> str:
    # Names and contents, in a fixed order, each length-prefixed so that no two different
    # trees can produce the same byte stream.
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if not p.is_dir() or p.is_symlink()):
        name = path.relative_to(root).as_posix().encode("utf-8", "surrogateescape")
        if path.is_symlink():
            content = b"link:" + os.readlink(path).encode("utf-8", "surrogateescape")
        elif path.is_file():
            content = b"file:" + bytes.fromhex(_file_sha256(path))
        else:  # a FIFO, socket or device: its name counts, reading it could block forever
            content = b"special:"
        for part in (name, content):
            digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


def _git(root: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, timeout=60).stdout


def _git_state(root: Path) -> tuple[str, str]:
    """HEAD's commit, and a hash of everything that differs from it (staged, unstaged and
    untracked files, ignored ones excluded)."""
    commit = _git(root, "rev-parse", "HEAD").decode().strip()
    digest = hashlib.sha256(_git(root, "diff", "--binary", "HEAD"))
    untracked = _git(root, "ls-files", "--others", "--exclude-standard", "-z").split(b"\0")
    for name in sorted(n for n in untracked if n):
        digest.update(len(name).to_bytes(8, "big") + name)
        digest.update(bytes.fromhex(_file_sha256(root / os.fsdecode(name))))
    return commit, digest.hexdigest()
