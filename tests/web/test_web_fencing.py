"""A stalled run owner cannot write once another process took its run over (SPEC §9).

Two app instances on one PostgreSQL database, as in test_web_two_processes.
Instance A starts a run whose tool blocks, and stops renewing its lease (its
lease keeper is stopped: a stalled process); the lease expires, instance B
takes the run over with a new epoch and finishes it. Then A's tool returns:
every write A's attempt still makes is fenced by its epoch and refused, so
the database holds B's outcome only, and A ends the run recording nothing.
"""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest
from webhelpers import eventually, serve

from webapp import Agent, tool
from webapp.models import ScriptedModel
from webapp.stores.checkpoint import RunHead
from webapp.stores.postgres import FencedOffError, fenced
from webapp.transcript import AssistantEntry, UserEntry
from webapp.web import create_app

ANSWER_A, ANSWER_B = "answer written by the stalled owner", "answer written by the new owner"


async def test_a_stalled_owner_taken_over_writes_nothing_after_the_takeover(postgres_dsn: str):
    entered, release = asyncio.Event(), asyncio.Event()

    @tool(name="lookup")
    async def lookup_a() -> str:
        """Look something up (on A it hangs until the test lets it go)."""
        entered.set()
        await release.wait()
        return "result seen by A"

    @tool(name="lookup")
    async def lookup_b() -> str:
        """Look something up."""
        return "result seen by B"

    model_a = ScriptedModel([[("lookup", {})], ANSWER_A])
    model_b = ScriptedModel([ANSWER_B])
    app_a = create_app(postgres_dsn, agent=Agent("assistant", model=model_a, tools=[lookup_a]))
    app_b = create_app(postgres_dsn, agent=Agent("assistant", model=model_b, tools=[lookup_b]))
    db = await asyncpg.connect(postgres_dsn)
    try:
        async with (
            serve(app_a) as base_a,
            serve(app_b),
            httpx.AsyncClient(base_url=base_a, timeout=20) as a,
        ):
            created = await a.post("/chats")
            chat_id = created.headers["location"].rsplit("/", 1)[1]
            assert (await a.post(f"/chats/{chat_id}/messages", data={"text": "look"})).is_redirect
            await asyncio.wait_for(entered.wait(), 10)
            run_id = str(
                await db.fetchval("SELECT active_run_id FROM chats WHERE id = $1", chat_id)
            )
            runs_a = app_a.state.web.runs
            stale = runs_a.get(run_id)
            old_epoch = stale.epoch

            # A stalls: nothing renews its lease, which runs out; B takes the run over.
            await app_a.state.web.keeper.stop()
            await db.execute(
                "UPDATE run_leases SET expires_at = now() - interval '1 second' WHERE run_id = $1",
                run_id,
            )

            async def finished_by_b() -> bool:
                chat = await db.fetchrow("SELECT active_run_id FROM chats WHERE id = $1", chat_id)
                return chat is not None and chat[0] is None

            await eventually(finished_by_b, 20, "B to take the run over and finish it")
            events_before = await db.fetchval(
                "SELECT count(*) FROM run_events WHERE run_id = $1 AND epoch = $2",
                run_id,
                old_epoch,
            )

            # A wakes up and goes on: its next save is refused, and so the run stops there.
            release.set()

            async def given_up() -> bool:
                return stale.finished

            await eventually(given_up, 10, "A to end its stale attempt")
            assert stale.abandoned and stale.lease_lost
            assert len(model_a.requests) == 1  # A never got to its second model turn

            # Whatever else the stale attempt might still write is refused too.
            cluster_a = runs_a.cluster
            with fenced(cluster_a.fence(run_id, old_epoch)):
                with pytest.raises(FencedOffError):
                    await runs_a.checkpointer.append(
                        run_id, [AssistantEntry(ANSWER_A)], RunHead("assistant")
                    )
                with pytest.raises(FencedOffError):
                    await runs_a.session.append(
                        chat_id, [UserEntry("look"), AssistantEntry(ANSWER_A)], run_id="late"
                    )
                with pytest.raises(FencedOffError):
                    await runs_a.store.request_stop(chat_id, run_id)
            cluster_a.write(run_id, old_epoch, 999, "text", ANSWER_A, None)
            await cluster_a.flush()

            # The database holds B's outcome, once, and nothing A wrote after B took over.
            rows = await db.fetch(
                "SELECT run_id, entries_json FROM session_segments WHERE session_id = $1",
                chat_id,
            )
            assert [r[0] for r in rows] == [run_id]
            stored = rows[0][1]
            assert ANSWER_B in stored and "result seen by B" in stored
            assert ANSWER_A not in stored and "result seen by A" not in stored
            assert await db.fetchval("SELECT count(*) FROM checkpoint_heads") == 0
            assert await db.fetchval("SELECT count(*) FROM checkpoint_entries") == 0
            chat = await db.fetchrow(
                "SELECT active_run_id, stop_requested_run_id FROM chats WHERE id = $1", chat_id
            )
            assert tuple(chat) == (None, None)
            events_after = await db.fetchval(
                "SELECT count(*) FROM run_events WHERE run_id = $1 AND epoch = $2",
                run_id,
                old_epoch,
            )
            assert events_after == events_before
    finally:
        release.set()
        await db.close()
