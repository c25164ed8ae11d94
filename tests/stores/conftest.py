"""Store tests run against every built-in store: memory, SQLite, SQLite in WAL mode, PostgreSQL.

A PostgreSQL store gets tables of its own (tests/conftest.py's ``postgres_dsn``:
an empty schema); the server starts with the first test that needs one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from webapp.stores.checkpoint import InMemoryCheckpointer
from webapp.stores.postgres_checkpoint import PostgresCheckpointer
from webapp.stores.postgres_session import PostgresSession
from webapp.stores.session import InMemorySession
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.stores.sqlite_session import SQLiteSession

KINDS = ["memory", "sqlite", "sqlite-wal", "postgres"]


@pytest.fixture(params=KINDS)
async def session(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[object]:
    if request.param == "memory":
        yield InMemorySession()
        return
    if request.param == "postgres":
        store: SQLiteSession | PostgresSession = PostgresSession(
            request.getfixturevalue("postgres_dsn")
        )
    else:
        store = SQLiteSession(tmp_path / "session.db", wal=request.param == "sqlite-wal")
    yield store
    await store.close()


@pytest.fixture(params=KINDS)
async def checkpointer(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[object]:
    if request.param == "memory":
        yield InMemoryCheckpointer()
        return
    if request.param == "postgres":
        store: SQLiteCheckpointer | PostgresCheckpointer = PostgresCheckpointer(
            request.getfixturevalue("postgres_dsn")
        )
    else:
        store = SQLiteCheckpointer(tmp_path / "runs.db", wal=request.param == "sqlite-wal")
    yield store
    await store.close()
