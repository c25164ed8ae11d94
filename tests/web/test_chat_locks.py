"""Per-chat locks: one chat's operations never interleave, and a lock nobody holds or
waits for is gone, so a process that touched 100,000 chats keeps no lock for them."""

from __future__ import annotations

import asyncio
import uuid

from webhelpers import MakeClient

from webapp.chats.users import EVERY_CHAT
from webapp.models import ScriptedModel
from webapp.web.chat_service import ChatNotFound
from webapp.web.live.chat_locks import ChatLocks


async def test_ten_thousand_chats_locked_leave_no_lock_behind(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["a reply"] * 20))
    runs = client.web.runs
    for n in range(10_000):
        async with runs.lock(f"chat-{n}"):
            pass
    assert len(runs._locks) == 0
    # Held at once, then let go: the same.
    holding = asyncio.Event()
    entered = 0

    async def hold(n: int) -> None:
        nonlocal entered
        async with runs.lock(f"at-once-{n}"):
            entered += 1
            await holding.wait()

    tasks = [asyncio.create_task(hold(n)) for n in range(1_000)]
    while entered < 1_000:
        await asyncio.sleep(0.01)
    assert len(runs._locks) == 1_000
    holding.set()
    await asyncio.gather(*tasks)
    assert len(runs._locks) == 0
    # Through the chat operations, which take the lock themselves, and the runs'
    # own tasks, which take it for their final bookkeeping.
    for _ in range(200):
        outcome = await client.web.chats.rename(EVERY_CHAT, uuid.uuid4().hex, "no such chat")
        assert isinstance(outcome, ChatNotFound)
    chat_ids = [await client.new_chat() for _ in range(10)]
    for chat_id in chat_ids:
        assert (await client.send(chat_id, "hi", client_id=chat_id)).status_code == 303
    for chat_id in chat_ids:
        await client.wait_idle(chat_id)
    for chat_id in chat_ids[:5]:
        assert (await client.http.post(f"/chats/{chat_id}/delete")).status_code == 303
    await asyncio.sleep(0.05)  # the runs' tasks let go of the lock after the chat's update
    assert len(runs._locks) == 0


async def test_two_operations_on_one_chat_take_turns_and_a_waiter_keeps_the_lock(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(model=ScriptedModel(["a reply"]))
    runs = client.web.runs
    order: list[str] = []
    first_in, let_first_go = asyncio.Event(), asyncio.Event()
    second_in, let_second_go = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with runs.lock("chat"):
            order.append("first in")
            first_in.set()
            await let_first_go.wait()
            order.append("first out")

    async def second() -> None:
        async with runs.lock("chat"):
            order.append("second in")
            second_in.set()
            await let_second_go.wait()
            order.append("second out")

    async def third() -> None:
        async with runs.lock("chat"):
            order.append("third in")

    one = asyncio.create_task(first())
    await first_in.wait()
    two = asyncio.create_task(second())
    await asyncio.sleep(0.05)
    assert order == ["first in"]  # the second waits
    let_first_go.set()
    await second_in.wait()
    # The second holds the lock it waited for, the one a newcomer finds: had the
    # first's release dropped it, the third would get a fresh lock and go in now.
    three = asyncio.create_task(third())
    await asyncio.sleep(0.05)
    assert order == ["first in", "first out", "second in"]
    let_second_go.set()
    await asyncio.gather(one, two, three)
    assert order == ["first in", "first out", "second in", "second out", "third in"]
    assert len(runs._locks) == 0


async def test_a_waiter_that_gives_up_leaves_the_lock_to_the_holder_alone():
    locks = ChatLocks()
    held, release = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with locks.hold("chat"):
            held.set()
            await release.wait()

    async def waiter() -> None:
        async with locks.hold("chat"):
            raise AssertionError("a cancelled waiter never gets the lock")

    holding = asyncio.create_task(holder())
    await held.wait()
    waiting = asyncio.create_task(waiter())
    await asyncio.sleep(0.01)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert len(locks) == 1  # the holder's, still held
    release.set()
    await holding
    assert len(locks) == 0
    async with locks.hold("chat"):  # and it can be taken again
        assert len(locks) == 1
    assert len(locks) == 0
