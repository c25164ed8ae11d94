"""The chat database on SQLite: a transaction is a job of the store's one connection.

Its function is a coroutine over `Tx`, each statement awaited through aiosqlite
between the store's BEGIN and COMMIT: what it writes commits whole or not at
all, no read sees it half done, and the event loop goes on while it waits.
"""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from webapp.chats.db import Tx
from webapp.chats.store import AlreadySentError, ChatBusyError, ChatStore, NewRun
from webapp.chats.users import EVERY_CHAT


def rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute(sql).fetchall()


async def test_a_send_is_recorded_whole_with_its_page_and_a_refused_one_leaves_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chat.db"
    async with ChatStore(path) as store:
        chat, other = await store.create(EVERY_CHAT), await store.create(EVERY_CHAT)
        # Eight statements: the client id, the tree's end and numbers, the new node,
        # the input, the chat's active run and title, and the chat as they left it.
        begun = await store.begin_run(
            chat.id, NewRun("r1", owner=EVERY_CHAT, client_id="c1", input="hi", title="hi")
        )
        assert (begun.chat.id, begun.chat.title, begun.chat.active_run_id) == (chat.id, "hi", "r1")
        assert begun.chat.updated_at >= chat.updated_at and begun.page is None
        page = await store.page(EVERY_CHAT, chat.id, before=None, limit=50, also=["r1"])
        assert page is not None and "r1" in page.tree.nodes
        # With the page its answer shows, read after the writes in the same transaction.
        page = (
            await store.begin_run(other.id, NewRun("r3", owner=EVERY_CHAT, input="yo"), page=50)
        ).page
        assert page is not None and list(page.tree.nodes) == ["r3"]
        # Refused by the database after some of its statements ran: none of them is kept.
        with pytest.raises(AlreadySentError):
            await store.begin_run(
                chat.id, NewRun("r2", owner=EVERY_CHAT, client_id="c1", input="hi again")
            )
        with pytest.raises(ChatBusyError):  # refused at its last write, the chat's own row
            await store.begin_run(
                chat.id, NewRun("r4", owner=EVERY_CHAT, client_id="c4", input="busy")
            )
    assert rows(path, "SELECT run_id FROM run_inputs ORDER BY run_id") == [("r1",), ("r3",)]
    assert rows(path, "SELECT run_id FROM chat_runs ORDER BY run_id") == [("r1",), ("r3",)]
    assert rows(path, "SELECT client_id, run_id FROM sends") == [("c1", "r1")]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_begin_run_returns_what_it_read_and_refuses_a_busy_chat(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    location = tmp_path / "chat.db" if kind == "sqlite" else request.getfixturevalue("postgres_dsn")
    async with ChatStore(location) as store:
        chat = await store.create(EVERY_CHAT)
        begun = await store.begin_run(
            chat.id, NewRun("r1", owner=EVERY_CHAT, input="hi", title="hi"), page=25
        )
        assert begun.chat.active_run_id == "r1" and begun.chat.title == "hi"
        assert begun.page is not None and list(begun.page.tree.nodes) == ["r1"]
        with pytest.raises(ChatBusyError):  # refused: nothing of it is kept
            await store.begin_run(chat.id, NewRun("r2", owner=EVERY_CHAT, input="again"))
        assert await store.run_input("r2") is None
        found = await store.get(EVERY_CHAT, chat.id)
        assert found is not None and found.active_run_id == "r1"


async def test_a_transaction_that_fails_writes_nothing_and_the_store_goes_on(
    tmp_path: Path,
) -> None:
    async with ChatStore(tmp_path / "chat.db") as store:
        chat = await store.create(EVERY_CHAT, "kept")

        async def fails(tx: Tx) -> None:
            await tx.execute("UPDATE chats SET title = 'lost' WHERE id = ?", (chat.id,))
            raise LookupError("the caller's own error, after a statement ran")

        with pytest.raises(LookupError, match="after a statement ran"):
            await store._store.write(fails)
        found = await store.get(EVERY_CHAT, chat.id)
        assert found is not None and found.title == "kept"
        await store.rename(EVERY_CHAT, chat.id, "renamed")
        found = await store.get(EVERY_CHAT, chat.id)
        assert found is not None and found.title == "renamed"


async def test_a_read_never_sees_a_transaction_half_done(tmp_path: Path) -> None:
    async with ChatStore(tmp_path / "chat.db") as store:
        chat = await store.create(EVERY_CHAT, "before")
        halfway, go_on = asyncio.Event(), asyncio.Event()

        async def slow(tx: Tx) -> None:
            await tx.execute("UPDATE chats SET title = 'after' WHERE id = ?", (chat.id,))
            halfway.set()
            await asyncio.wait_for(go_on.wait(), 5)  # holds the transaction open
            await tx.execute("UPDATE chats SET updated_at = 0 WHERE id = ?", (chat.id,))

        write = asyncio.ensure_future(store._store.write(slow))
        await asyncio.wait_for(halfway.wait(), 5)
        read = asyncio.ensure_future(store.get(EVERY_CHAT, chat.id))
        await asyncio.sleep(0.05)
        assert not read.done()  # it waits for the write rather than see its first half
        go_on.set()
        await write
        seen = await asyncio.wait_for(read, 5)
        assert seen is not None and (seen.title, seen.updated_at) == ("after", 0)


async def test_a_transaction_that_calls_the_chat_database_is_refused(tmp_path: Path) -> None:
    async with ChatStore(tmp_path / "chat.db") as store:
        chat = await store.create(EVERY_CHAT, "kept")

        async def nested(tx: Tx) -> None:
            await tx.execute("UPDATE chats SET title = 'lost' WHERE id = ?", (chat.id,))
            await store.get(
                EVERY_CHAT, chat.id
            )  # a second job of the same store: it would wait for this one

        with pytest.raises(RuntimeError, match="would wait for itself"):
            await asyncio.wait_for(store._store.write(nested), 5)
        found = await store.get(EVERY_CHAT, chat.id)
        assert found is not None and found.title == "kept"


async def test_the_event_loop_goes_on_while_a_transaction_waits_for_a_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chat.db"
    async with ChatStore(path) as store:
        chat = await store.create(EVERY_CHAT, "kept")
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process writing, say
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        asyncio.get_running_loop().call_later(0.3, other.execute, "COMMIT")
        try:
            assert await store.rename(EVERY_CHAT, chat.id, "renamed")
        finally:
            ticker.cancel()
            other.close()
        assert ticks >= 10  # SQLite waited on the connection's thread, not the loop's
        found = await store.get(EVERY_CHAT, chat.id)
        assert found is not None and found.title == "renamed"
