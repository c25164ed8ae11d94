"""Helpers for the tests of accounts (SPEC §13): an app with password sign-in, people
with their own cookie jars, and what the database holds about them."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from starlette.applications import Starlette
from webhelpers import WebClient

from webapp.chats.db import numbered
from webapp.chats.passwords import hash_password
from webapp.chats.users import Account

PASSWORD = "correct horse battery staple"
HTML = {"Accept": "text/html,application/xhtml+xml"}


async def add_user(client: WebClient, name: str, *, admin: bool = False) -> Account:
    return await client.web.store.users.add(name, hash_password(PASSWORD), admin=admin)


def http_for(app: Starlette, address: str = "127.0.0.1") -> httpx.AsyncClient:
    """A browser of its own (its own cookies) on ``app``, connecting from ``address``."""
    transport = httpx.ASGITransport(app=app, client=(address, 50000))
    return httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=20)


async def sign_in(http: httpx.AsyncClient, name: str, password: str = PASSWORD) -> httpx.Response:
    return await http.post("/login", data={"name": name, "password": password})


@contextlib.asynccontextmanager
async def person(
    app: Starlette, name: str, *, address: str = "127.0.0.1"
) -> AsyncIterator[httpx.AsyncClient]:
    """A browser signed in as ``name`` (an existing account with `PASSWORD`)."""
    async with http_for(app, address) as http:
        signed = await sign_in(http, name)
        assert signed.status_code == 303, signed.text
        yield http


async def new_chat(http: httpx.AsyncClient) -> str:
    created = await http.post("/chats")
    assert created.status_code == 303, created.text
    found = re.search(r"/chats/([0-9a-f]{32})$", created.headers["location"])
    assert found, created.headers["location"]
    return found.group(1)


async def rows(db: Path | str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """What the database holds (SQL with ``?`` placeholders), read on a connection of
    its own: the SQLite file, or the PostgreSQL database."""
    if isinstance(db, str) and db.startswith("postgresql://"):
        conn = await asyncpg.connect(db)
        try:
            return [tuple(r) for r in await conn.fetch(numbered(sql), *params)]
        finally:
            await conn.close()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [tuple(r) for r in conn.execute(sql, params)]


async def execute(db: Path | str, sql: str, *params: Any) -> None:
    """Change the database behind the app's back (as another part of the app would)."""
    if isinstance(db, str) and db.startswith("postgresql://"):
        conn = await asyncpg.connect(db)
        try:
            await conn.execute(numbered(sql), *params)
        finally:
            await conn.close()
        return
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(sql, params)


TABLES = ("chats", "chat_runs", "session_segments", "sends", "run_inputs")


async def snapshot(db: Path | str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the tables a chat operation writes (checkpoints aside: a reply that is
    running writes them all along)."""
    return {t: sorted(map(repr, await rows(db, f"SELECT * FROM {t}"))) for t in TABLES}  # type: ignore[misc]
