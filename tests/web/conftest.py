"""Fixtures for the web app's in-process route tests.

Each test builds its own app over a real SQLite file in tmp_path, runs the
app's lifespan (so start-up recovery and shutdown run as in production) and
talks to it through httpx's ASGI transport. Fixture names start with
``web_`` so they never collide with the browser tests' fixtures below.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from webhelpers import MakeClient, WebClient

from webapp.web import create_app


@pytest.fixture
def db_kind() -> str:
    """The database the app runs on (see `pytest_generate_tests`)."""
    return "sqlite"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module with ``ON_BOTH_DATABASES = True`` runs each test that builds the app
    twice: on a SQLite file and on PostgreSQL."""
    if "db_kind" in metafunc.fixturenames and getattr(metafunc.module, "ON_BOTH_DATABASES", False):
        metafunc.parametrize("db_kind", ["sqlite", "postgres"])


@pytest.fixture
async def web_client_factory(
    tmp_path: Path, db_kind: str, request: pytest.FixtureRequest
) -> AsyncIterator[MakeClient]:
    """``await make(model=..., **create_app_kwargs)`` -> a WebClient with its lifespan running,
    on a SQLite file in tmp_path or (``db_kind`` "postgres") a PostgreSQL schema of its own."""
    async with contextlib.AsyncExitStack() as stack:
        default: Path | str = tmp_path / "chat.db"
        if db_kind == "postgres":
            default = request.getfixturevalue("postgres_dsn")

        async def make(db: Path | str | None = None, **kwargs: Any) -> WebClient:
            path = db or default
            app = create_app(path, **kwargs)
            await stack.enter_async_context(app.router.lifespan_context(app))
            http = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://testserver"
            )
            await stack.enter_async_context(http)
            return WebClient(app, http, path)

        yield make
