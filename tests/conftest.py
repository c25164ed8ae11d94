"""Fixtures shared by every test folder: a throwaway PostgreSQL server (see tests/postgres.py).

The server starts on first use only, so a run without PostgreSQL tests never
pays for it. Without PostgreSQL binaries those tests are skipped on a
developer's machine, but fail under CI=true: CI must never skip them.
"""

from __future__ import annotations

from collections.abc import Iterator

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
