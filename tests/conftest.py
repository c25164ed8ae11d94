"""Fixtures shared by every test folder: a throwaway PostgreSQL server (see tests/postgres.py),
and a count of the trips to SQLite connections' threads.

The server starts on first use only, so a run without PostgreSQL tests never
pays for it. Without PostgreSQL binaries those tests are skipped on a
developer's machine, but fail under CI=true: CI must never skip them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import aiosqlite
import pytest
from postgres import Cluster, NoPostgres, missing_postgres


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    try:
        cluster = Cluster().start()
    except NoPostgres as exc:
        missing_postgres(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def postgres_dsn(postgres_cluster: Cluster) -> str:
    """A ``postgresql://`` URL whose tables are this test's own (an empty schema)."""
    return postgres_cluster.new_dsn()


@pytest.fixture
def count_sqlite_trips(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[int]]:
    """``trips = count_sqlite_trips()`` counts, from then on, the trips to any aiosqlite
    connection's thread in ``trips[0]`` (every call there goes through ``_execute``)."""

    def start() -> list[int]:
        trips = [0]
        real = aiosqlite.Connection._execute

        async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
            trips[0] += 1
            return await real(self, fn, *args, **kwargs)

        monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
        return trips

    return start
