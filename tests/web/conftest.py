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
async def web_client_factory(tmp_path: Path) -> AsyncIterator[MakeClient]:
    """``await make(model=..., **create_app_kwargs)`` -> a WebClient with its lifespan running."""
    async with contextlib.AsyncExitStack() as stack:

        async def make(db: Path | None = None, **kwargs: Any) -> WebClient:
            path = db or tmp_path / "chat.db"
            app = create_app(path, **kwargs)
            await stack.enter_async_context(app.router.lifespan_context(app))
            http = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://testserver"
            )
            await stack.enter_async_context(http)
            return WebClient(app, http, path)

        yield make
