"""Chat locks across processes (`webapp.stores.postgres_cluster`): held on the connection that works.

Each `Cluster` here is what one app process has; they share only the
database. A chat lock is an advisory lock on a connection of its own, and the
store operations under it run on that very connection: so losing it, which
frees the lock on the server, stops the work too, instead of letting it go on
beside the next holder (what a lock on a shared connection allowed).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from webapp.stores.postgres import LockLostError, PostgresStore
from webapp.stores.postgres_cluster import PostgresCluster as Cluster

COUNTER = "CREATE TABLE IF NOT EXISTS counter (chat TEXT PRIMARY KEY, n INTEGER NOT NULL);"
HOLDER = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
    "AND classid = hashtext('webapp.chat')::oid AND objid = hashtext($1)::oid"
)


@contextlib.asynccontextmanager
async def processes(dsn: str, count: int = 2) -> AsyncIterator[list[Cluster]]:
    clusters = [Cluster(dsn, owner=uuid.uuid4().hex[:12]) for _ in range(count)]
    try:
        for cluster in clusters:
            await cluster.start()
        yield clusters
    finally:
        for cluster in clusters:
            await cluster.close()


@pytest.fixture
async def raw(postgres_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(postgres_dsn)
    yield conn
    await conn.close()


async def holder_pid(raw: asyncpg.Connection, key: str) -> int | None:
    found = await raw.fetchval(HOLDER, key)
    return int(found) if found is not None else None


async def test_the_lock_is_held_for_the_block_on_the_connection_doing_its_work(
    postgres_dsn: str, raw: asyncpg.Connection
):
    store = PostgresStore(postgres_dsn, schema_name="c", schema_version=1, schema_sql=COUNTER)
    async with processes(postgres_dsn, 1) as [a]:
        async with a.chat_lock("chat-1"):
            pid = await holder_pid(raw, "chat-1")
            assert pid is not None
            # The block's store work runs on the lock's own connection.
            [(worker,)] = await store.fetch("SELECT pg_backend_pid()")
            assert worker == pid
        assert await holder_pid(raw, "chat-1") is None  # released as the block ends
    await store.close()


async def test_a_lock_inside_another_of_the_same_task_shares_its_connection(
    postgres_dsn: str, raw: asyncpg.Connection
):
    async with processes(postgres_dsn, 1) as [a]:
        async with a.chat_lock("new:client"):
            async with a.chat_lock("chat-1"):
                outer, inner = await holder_pid(raw, "new:client"), await holder_pid(raw, "chat-1")
                assert outer is not None and outer == inner
            assert await holder_pid(raw, "chat-1") is None
            assert await holder_pid(raw, "new:client") == outer
        assert await holder_pid(raw, "new:client") is None


async def test_two_processes_working_on_one_chat_take_turns(postgres_dsn: str):
    store = PostgresStore(postgres_dsn, schema_name="c", schema_version=1, schema_sql=COUNTER)
    await store.execute("INSERT INTO counter VALUES ('chat-1', 0)")
    inside: list[str] = []
    overlaps: list[list[str]] = []

    async def add_one(cluster: Cluster, name: str) -> None:
        async with cluster.chat_lock("chat-1"):
            inside.append(name)
            if len(inside) > 1:
                overlaps.append(list(inside))
            # Read, think, write: a lost update whenever two of these interleave.
            [(n,)] = await store.fetch("SELECT n FROM counter WHERE chat = 'chat-1'")
            await asyncio.sleep(0.005)
            await store.execute("UPDATE counter SET n = $1 WHERE chat = 'chat-1'", n + 1)
            inside.remove(name)

    async with processes(postgres_dsn, 2) as [a, b]:
        await asyncio.wait_for(
            asyncio.gather(
                *(add_one(c, f"{n}{i}") for i in range(15) for c, n in ((a, "a"), (b, "b")))
            ),
            60,
        )
    [(total,)] = await store.fetch("SELECT n FROM counter WHERE chat = 'chat-1'")
    await store.close()
    assert overlaps == [] and total == 30


async def test_losing_the_lock_connection_stops_the_work_under_it(
    postgres_dsn: str, raw: asyncpg.Connection
):
    store = PostgresStore(postgres_dsn, schema_name="c", schema_version=1, schema_sql=COUNTER)
    await store.execute("INSERT INTO counter VALUES ('chat-1', 0)")
    started, lost = asyncio.Event(), asyncio.Event()
    outcome: list[BaseException] = []

    async def a_work(cluster: Cluster) -> None:
        try:
            async with cluster.chat_lock("chat-1"):
                await store.execute("UPDATE counter SET n = n + 1 WHERE chat = 'chat-1'")
                started.set()
                await lost.wait()  # a stall: meanwhile the server drops the lock's connection
                await store.execute("UPDATE counter SET n = n + 100 WHERE chat = 'chat-1'")
        except LockLostError as exc:
            outcome.append(exc)

    async def b_work(cluster: Cluster) -> None:
        async with cluster.chat_lock("chat-1"):
            await store.execute("UPDATE counter SET n = n * 10 WHERE chat = 'chat-1'")

    async with processes(postgres_dsn, 2) as [a, b]:
        first = asyncio.create_task(a_work(a))
        await asyncio.wait_for(started.wait(), 10)
        second = asyncio.create_task(b_work(b))
        await asyncio.sleep(0.2)
        assert not second.done()  # B waits for A's lock
        pid = await holder_pid(raw, "chat-1")
        assert pid is not None
        await raw.execute("SELECT pg_terminate_backend($1)", pid)
        await asyncio.wait_for(second, 10)  # the server freed the lock: B had its turn
        lost.set()
        await asyncio.wait_for(first, 10)
    [(n,)] = await store.fetch("SELECT n FROM counter WHERE chat = 'chat-1'")
    await store.close()
    assert len(outcome) == 1  # A's work after the loss was refused, not done unlocked
    assert n == 10  # A's first step, then B's: nothing of A's after B's
