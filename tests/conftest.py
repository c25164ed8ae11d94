"""Fixtures shared by every test folder: a throwaway PostgreSQL server (see tests/postgres.py).

The server starts on first use only, so a run without PostgreSQL tests never
pays for it. Without PostgreSQL binaries those tests are skipped on a
developer's machine, but fail under CI=true: CI must never skip them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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


# --- kinds of test (pyproject.toml declares the markers) -----------------------------

_TESTS = Path(__file__).parent


def _needs_postgres(item: pytest.Item) -> bool:
    """A test that starts the throwaway PostgreSQL server: through its fixtures, or
    through a parameter naming the back end a fixture then asks for by name."""
    if {"postgres_cluster", "postgres_dsn"} & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "postgres" in callspec.params.values()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by what it needs, so ``-m "not browser and not postgres and not
    slow"`` is the inner loop: `browser` (Chromium, tests/web/browser), `postgres` (a
    PostgreSQL server) and `slow` (marked where it stands: real processes killed and
    restarted, nginx, npm-installed servers, a wheel built)."""
    browser = _TESTS / "web" / "browser"
    for item in items:
        # The Chromium fixture is named "browser" wherever a test drives one.
        if browser in Path(item.path).parents or "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
        if _needs_postgres(item):
            item.add_marker(pytest.mark.postgres)
