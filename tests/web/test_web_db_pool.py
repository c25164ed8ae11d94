"""``--db-pool-size``: one process opens at most that many PostgreSQL connections
(SPEC §17); on main each process opened five pools of fixed sizes, 43 connections."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import pytest
from webhelpers import MakeClient

from webapp.db_pools import MIN_POOL_SIZE, shares
from webapp.web import create_app

COUNT = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
)


def test_the_pool_size_is_shared_out_and_never_exceeded():
    for total in (MIN_POOL_SIZE, 7, 10, 20, 43, 100):
        assert shares(total).total == total
    assert shares(20).chats == 8 and shares(20).listener == 1
    with pytest.raises(ValueError, match="at least 6"):
        shares(5)
    with pytest.raises(ValueError, match="at least 6"):
        create_app("postgresql://nobody@127.0.0.1:9/none", db_pool_size=3)


async def test_one_process_opens_at_most_its_pool_size(
    web_client_factory: MakeClient, postgres_dsn: str
):
    watcher = await asyncpg.connect(postgres_dsn)
    try:
        baseline = int(await watcher.fetchval(COUNT))
        client = await web_client_factory(db=postgres_dsn, db_pool_size=MIN_POOL_SIZE)
        peak = 0

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, int(await watcher.fetchval(COUNT)) - baseline)
                await asyncio.sleep(0.005)

        sampler = asyncio.create_task(sample())
        try:
            chats = [await client.new_chat() for _ in range(12)]
            sent = await asyncio.gather(*(client.send(c, "count to 60") for c in chats))
            assert all(s.status_code == 303 for s in sent)
            pages = await asyncio.gather(*(client.http.get(f"/chats/{c}") for c in chats))
            assert all(p.status_code == 200 for p in pages)
            for chat_id in chats:
                await client.wait_idle(chat_id, timeout=60)
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        assert 0 < peak <= MIN_POOL_SIZE, peak  # on main: pools of 10, 10, 10, 4 and 8
    finally:
        await watcher.close()
