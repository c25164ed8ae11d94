"""Runner tests run against both the in-memory and the SQLite stores."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from webapp import InMemoryCheckpointer, InMemorySession


@dataclass
class Stores:
    session: object
    checkpointer: object


@pytest.fixture(params=["memory", "sqlite"])
async def stores(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Stores]:
    if request.param == "memory":
        yield Stores(InMemorySession(), InMemoryCheckpointer())
        return
    from webapp import SQLiteCheckpointer, SQLiteSession

    db = tmp_path / "runs.db"  # one file for both, as the web app uses it
    session, checkpointer = SQLiteSession(db, wal=True), SQLiteCheckpointer(db, wal=True)
    yield Stores(session, checkpointer)
    await session.close()
    await checkpointer.close()
