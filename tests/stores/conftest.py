"""Store tests run against every built-in store: memory, SQLite, SQLite in WAL mode."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from webapp.stores.checkpoint import InMemoryCheckpointer
from webapp.stores.session import InMemorySession
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.stores.sqlite_session import SQLiteSession

KINDS = ["memory", "sqlite", "sqlite-wal"]


@pytest.fixture(params=KINDS)
async def session(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[object]:
    if request.param == "memory":
        yield InMemorySession()
        return
    store = SQLiteSession(tmp_path / "session.db", wal=request.param == "sqlite-wal")
    yield store
    await store.close()


@pytest.fixture(params=KINDS)
async def checkpointer(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[object]:
    if request.param == "memory":
        yield InMemoryCheckpointer()
        return
    store = SQLiteCheckpointer(tmp_path / "runs.db", wal=request.param == "sqlite-wal")
    yield store
    await store.close()
