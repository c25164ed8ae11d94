"""Runner tests run against the in-memory, the SQLite and the PostgreSQL stores."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from webapp import InMemoryCheckpointer, InMemorySession


@dataclass
class Stores:
    session: object
    checkpointer: object


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def stores(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Stores]:
    if request.param == "memory":
        yield Stores(InMemorySession(), InMemoryCheckpointer())
        return
    if request.param == "postgres":
        from webapp import PostgresCheckpointer, PostgresSession

        dsn = request.getfixturevalue("postgres_dsn")  # one database for both, as the app
        pg_session, pg_checkpointer = PostgresSession(dsn), PostgresCheckpointer(dsn)
        yield Stores(pg_session, pg_checkpointer)
        await pg_session.close()
        await pg_checkpointer.close()
        return
    from webapp import SQLiteCheckpointer, SQLiteSession

    db = tmp_path / "runs.db"  # one file for both, as the web app uses it
    session, checkpointer = SQLiteSession(db, wal=True), SQLiteCheckpointer(db, wal=True)
    yield Stores(session, checkpointer)
    await session.close()
    await checkpointer.close()
