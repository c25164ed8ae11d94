"""Tools that ask first with two app processes on one PostgreSQL database (SPEC §9, §11).

Each app instance is what one process would be (its own run manager, lease owner, locks
and connections; see test_web_two_processes.py). The tool and the list of what it did
are shared, since both instances live in this test's process: exactly what lets a test
count executions across "processes".
"""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
from test_web_approvals import Notes, decision_form, note_agent
from webhelpers import eventually, parse_html, replies, two_processes

from webapp.models import ScriptedModel
from webapp.stores.cluster import LeaseTimes

RENEW_SECONDS = LeaseTimes().renew


async def fetchval(dsn: str, sql: str, *args: object) -> object:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def waiting_on_both(dsn: str, a: httpx.AsyncClient, b: httpx.AsyncClient, chat_id: str):  # type: ignore[no-untyped-def]
    """Wait until the run waits; both processes show its card. Returns the card's Allow form."""

    async def paused() -> bool:
        return bool(await fetchval(dsn, "SELECT count(*) FROM paused_runs"))

    await eventually(paused, 10, "the run to wait for approval")
    forms = []
    for http in (a, b):
        [reply] = replies(parse_html((await http.get(f"/chats/{chat_id}")).text))
        assert reply.attrs["data-status"] == "waiting"
        forms.append(decision_form(reply.find(data_role="tool"), "Allow"))
    assert forms[0] == forms[1]
    return forms[0]


async def idle(dsn: str, chat_id: str) -> None:
    async def done() -> bool:
        sql = "SELECT active_run_id IS NULL FROM chats WHERE id = $1"
        return bool(await fetchval(dsn, sql, chat_id))

    await eventually(done, 15, "the run to finish")


async def test_a_decision_on_the_other_process_resumes_the_run_there_once(postgres_dsn: str):
    notes = Notes()
    agent_a = note_agent(notes, [("write_note", {"text": "pg"})])  # A pauses: one turn
    agent_b = note_agent(notes, "Written on B.")  # B resumes: the model's next turn
    async with two_processes(postgres_dsn, {"agent": agent_a}, {"agent": agent_b}) as (a, b):
        chat_id = (await a.post("/chats")).headers["location"].rsplit("/", 1)[1]
        await a.post(f"/chats/{chat_id}/messages", data={"text": "note pg"})
        form = await waiting_on_both(postgres_dsn, a, b, chat_id)
        # While it waits nobody holds it: no lease, no takeover by either lease keeper.
        await asyncio.sleep(RENEW_SECONDS * 1.5)
        assert await fetchval(postgres_dsn, "SELECT count(*) FROM run_leases") == 0
        assert notes.written == []
        assert isinstance(agent_b.model, ScriptedModel) and agent_b.model.requests == []
        action = form.pop("action")
        first = await b.post(action, data=form)
        second = await b.post(action, data=form)  # a double click, on the same process
        assert (first.status_code, second.status_code) == (303, 303)
        await idle(postgres_dsn, chat_id)
        assert notes.written == ["pg"]
        assert len(agent_b.model.requests) == 1
        for http in (a, b):
            [reply] = replies(parse_html((await http.get(f"/chats/{chat_id}")).text))
            assert reply.find(class_="content").norm_text() == "Written on B."
            assert reply.find(class_="approval-label").norm_text() == "Allowed"


async def test_decisions_on_both_processes_at_once_execute_once(postgres_dsn: str):
    notes = Notes()
    agent_a = note_agent(notes, [("write_note", {"text": "both"})], "Written.")
    agent_b = note_agent(notes, "Written.")
    async with two_processes(postgres_dsn, {"agent": agent_a}, {"agent": agent_b}) as (a, b):
        chat_id = (await a.post("/chats")).headers["location"].rsplit("/", 1)[1]
        await a.post(f"/chats/{chat_id}/messages", data={"text": "note both"})
        form = await waiting_on_both(postgres_dsn, a, b, chat_id)
        action = form.pop("action")
        answers = await asyncio.gather(
            *(http.post(action, data=form) for http in (a, b, a, b, b, a))
        )
        assert {r.status_code for r in answers} == {303}
        await idle(postgres_dsn, chat_id)
        assert notes.written == ["both"]
        resumed = [m for m in (agent_a.model, agent_b.model) if isinstance(m, ScriptedModel)]
        assert len(resumed[0].requests) - 1 + len(resumed[1].requests) == 1
        page = parse_html((await b.get(f"/chats/{chat_id}")).text)
        assert [r.attrs["data-status"] for r in replies(page)] == ["completed"]
