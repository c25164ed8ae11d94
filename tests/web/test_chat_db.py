"""The chat database on SQLite: a transaction runs whole on the connection's thread.

Its function is a coroutine over `Tx`; on SQLite nothing it awaits suspends, so
it goes to the thread in one trip, however many statements it runs, and one
that awaits anything else is refused, with nothing written.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from webapp.chats.db import Tx
from webapp.chats.store import AlreadySentError, ChatBusyError, ChatStore, NewRun


async def test_a_send_is_recorded_with_its_page_in_one_trip(
    tmp_path: Path, count_sqlite_trips: Callable[[], list[int]]
) -> None:
    async with ChatStore(tmp_path / "chat.db") as store:
        chat, other = await store.create(), await store.create()
        trips = count_sqlite_trips()
        # Eight statements: the client id, the tree's end and numbers, the new node,
        # the input, the chat's active run and title, and the chat as they left it.
        begun = await store.begin_run(chat.id, NewRun("r1", client_id="c1", input="hi", title="hi"))
        assert trips[0] == 1
        assert (begun.chat.id, begun.chat.title, begun.chat.active_run_id) == (chat.id, "hi", "r1")
        assert begun.chat.updated_at >= chat.updated_at and begun.page is None
        page = await store.page(chat.id, before=None, limit=50, also=["r1"])
        assert trips[0] == 2
        assert page is not None and "r1" in page.tree.nodes
        # With the page its answer shows, read after the writes in the same one trip.
        page = (await store.begin_run(other.id, NewRun("r3", input="yo"), page=50)).page
        assert trips[0] == 3
        assert page is not None and list(page.tree.nodes) == ["r3"]
        # Refused by the database, in the same one trip: nothing of it is kept.
        with pytest.raises(AlreadySentError):
            await store.begin_run(chat.id, NewRun("r2", client_id="c1", input="hi again"))
        assert trips[0] == 4
    with closing(sqlite3.connect(tmp_path / "chat.db")) as db:
        rows = db.execute("SELECT run_id FROM run_inputs ORDER BY run_id").fetchall()
        assert rows == [("r1",), ("r3",)]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_begin_run_returns_what_it_read_and_refuses_a_busy_chat(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    location = tmp_path / "chat.db" if kind == "sqlite" else request.getfixturevalue("postgres_dsn")
    async with ChatStore(location) as store:
        chat = await store.create()
        begun = await store.begin_run(chat.id, NewRun("r1", input="hi", title="hi"), page=25)
        assert begun.chat.active_run_id == "r1" and begun.chat.title == "hi"
        assert begun.page is not None and list(begun.page.tree.nodes) == ["r1"]
        with pytest.raises(ChatBusyError):  # refused: nothing of it is kept
            await store.begin_run(chat.id, NewRun("r2", input="again"))
        assert await store.run_input("r2") is None
        found = await store.get(chat.id)
        assert found is not None and found.active_run_id == "r1"


async def test_a_transaction_that_awaits_anything_else_is_refused_and_writes_nothing(
    tmp_path: Path,
) -> None:
    async with ChatStore(tmp_path / "chat.db") as store:
        chat = await store.create("kept")
        database = store._store

        async def strays(tx: Tx) -> None:
            await tx.execute("UPDATE chats SET title = 'lost' WHERE id = ?", (chat.id,))
            await asyncio.sleep(0)  # not the transaction's: it would suspend on the thread

        with pytest.raises(RuntimeError, match="awaited something besides its transaction"):
            await database.write(strays)
        with pytest.raises(RuntimeError, match="awaited something besides its transaction"):
            await database.read(strays)
        found = await store.get(chat.id)
        assert found is not None and found.title == "kept"
        await store.rename(chat.id, "renamed")  # the store goes on
        found = await store.get(chat.id)
        assert found is not None and found.title == "renamed"


async def test_a_transaction_runs_off_the_event_loops_thread(tmp_path: Path) -> None:
    async with ChatStore(tmp_path / "chat.db") as store:
        seen: list[int] = []

        async def where(tx: Tx) -> list[Any]:
            seen.append(threading.get_ident())
            return await tx.fetch("SELECT 1")

        assert await store._store.read(where) == [(1,)]
        assert seen and seen[0] != threading.get_ident()
