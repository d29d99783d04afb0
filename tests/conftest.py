from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import zincir


class ManualClock:
    """An injected database clock (integer ms) that moves only when a test says so."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += round(seconds * 1000)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "zincir.db"


@pytest.fixture
async def db(db_path: Path) -> AsyncIterator[zincir.Database]:
    async with zincir.open_database(db_path) as database:
        yield database


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def clocked_db(db_path: Path, clock: ManualClock) -> AsyncIterator[zincir.Database]:
    async with zincir.open_database(db_path, clock=clock) as database:
        yield database
