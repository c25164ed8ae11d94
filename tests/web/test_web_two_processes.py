"""Two app instances on one PostgreSQL database: each is what one process would be.

Every instance has its own run manager, lease owner id, locks and
connections, and serves on its own uvicorn server on 127.0.0.1; they share
nothing but the database, exactly like two processes. (tests/cluster/ runs
real processes, kill -9 and nginx.) Each test checks that an operation on
one instance acts on a run the other executes, and what the database holds.
"""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
from webhelpers import (
    HX,
    eventually,
    form_of,
    parse_html,
    read_events,
    replies,
    serve,
    text_of_fragments,
    two_processes,
)

from webapp.models import OfflineModel, ScriptedModel
from webapp.web import create_app

NUMBERS = " ".join(str(i) for i in range(1, 81))
WORDS = "a reply long enough to be still streaming when the other send arrives"


async def new_chat(http: httpx.AsyncClient) -> str:
    created = await http.post("/chats")
    return str(created.headers["location"].rsplit("/", 1)[1])


async def live_reply_url(http: httpx.AsyncClient, chat_id: str, text: str) -> str:
    """Send through ``http``; returns the reply's stream address from the response."""
    sent = await http.post(f"/chats/{chat_id}/messages", data={"text": text}, headers=HX)
    assert sent.status_code == 200, sent.text
    return str(replies(parse_html(sent.text))[-1].attrs["sse-connect"])


async def active_run(dsn: str, chat_id: str) -> str | None:
    conn = await asyncpg.connect(dsn)
    try:
        found = await conn.fetchval("SELECT active_run_id FROM chats WHERE id = $1", chat_id)
        return str(found) if found is not None else None
    finally:
        await conn.close()


async def test_a_reply_streams_from_either_process_with_one_set_of_positions(postgres_dsn: str):
    model = ScriptedModel([NUMBERS], chunk_delay=0.02)
    async with two_processes(postgres_dsn, {"model": model}, {"model": ScriptedModel([])}) as (
        a,
        b,
    ):
        chat_id = await new_chat(a)
        url = await live_reply_url(a, chat_id, "count")
        # A browser on B follows the run A executes: a few events from B ...
        first = await read_events(b, url, {}, limit=3)
        assert [e.event for e in first] == ["text"] * 3
        # ... a reconnect that lands on A continues from B's last position ...
        middle = await read_events(a, url, {"Last-Event-ID": first[-1].id or ""}, limit=3)
        # ... and one that lands on B again reads on to the end.
        rest = await read_events(b, url, {"Last-Event-ID": middle[-1].id or ""}, None)
        assert rest[-1].event == "done"
        events = first + middle + rest
        assert text_of_fragments(events) == NUMBERS  # no gap, no duplicate
        seqs = [int((e.id or "x:0").rsplit(":", 1)[1]) for e in events]
        assert seqs == sorted(set(seqs))
        assert len({(e.id or "").rsplit(":", 1)[0] for e in events}) == 1  # one epoch
        # Both processes show the finished reply, from the database.
        for http in (a, b):
            page = parse_html((await http.get(f"/chats/{chat_id}")).text)
            assert replies(page)[0].find(class_="content").norm_text() == NUMBERS


async def test_a_page_on_the_other_process_shows_the_run_live(postgres_dsn: str):
    model = ScriptedModel([NUMBERS], chunk_delay=0.03)
    async with two_processes(postgres_dsn, {"model": model}, {"model": ScriptedModel([])}) as (
        a,
        b,
    ):
        chat_id = await new_chat(a)
        await live_reply_url(a, chat_id, "count")
        await asyncio.sleep(0.5)
        page = parse_html((await b.get(f"/chats/{chat_id}")).text)
        reply = replies(page)[0]
        assert reply.attrs["data-status"] == "streaming"
        shown = reply.find(class_="content").text()
        assert shown and NUMBERS.startswith(shown) and shown != NUMBERS
        rest = await read_events(b, reply.attrs["sse-connect"] or "", {}, None)
        assert shown + text_of_fragments(rest) == NUMBERS


async def test_one_run_per_chat_is_decided_in_the_database(postgres_dsn: str):
    replies_a = ScriptedModel([WORDS] * 8, chunk_delay=0.05)
    replies_b = ScriptedModel([WORDS] * 8, chunk_delay=0.05)
    async with two_processes(postgres_dsn, {"model": replies_a}, {"model": replies_b}) as (a, b):
        chat_id = await new_chat(a)
        for round_ in range(4):
            sent = await asyncio.gather(
                a.post(f"/chats/{chat_id}/messages", data={"text": f"a{round_}"}),
                b.post(f"/chats/{chat_id}/messages", data={"text": f"b{round_}"}),
            )
            assert sorted(r.status_code for r in sent) == [303, 409], [r.text for r in sent]

            async def idle() -> bool:
                return await active_run(postgres_dsn, chat_id) is None

            await eventually(idle, 10, "the run to finish")
        page = parse_html((await b.get(f"/chats/{chat_id}")).text)
        assert len(replies(page)) == 4  # one run per round, each stored once


async def test_stop_on_one_process_ends_the_run_the_other_executes(postgres_dsn: str):
    model = ScriptedModel([NUMBERS, "after"], chunk_delay=0.05)
    async with two_processes(postgres_dsn, {"model": model}, {"model": ScriptedModel([])}) as (
        a,
        b,
    ):
        chat_id = await new_chat(a)
        url = await live_reply_url(a, chat_id, "count")
        await read_events(b, url, {}, limit=5)
        run_id = url.split("/runs/")[1].split("/")[0]
        stopped = await b.post(f"/chats/{chat_id}/runs/{run_id}/stop", headers=HX)
        assert stopped.status_code == 200
        reply = replies(parse_html(stopped.text))[0]
        assert reply.attrs["data-status"] == "stopped"
        kept = reply.find(class_="content").norm_text()
        assert kept and NUMBERS.startswith(kept) and kept != NUMBERS
        assert await active_run(postgres_dsn, chat_id) is None
        # The stop is durable and the same from both sides; the text no longer grows.
        await asyncio.sleep(0.3)
        for http in (a, b):
            page = parse_html((await http.get(f"/chats/{chat_id}")).text)
            shown = replies(page)[0]
            assert shown.attrs["data-status"] == "stopped"
            assert shown.find(class_="content").norm_text() == kept
        # The chat takes the next message at once, through either process.
        assert (await a.post(f"/chats/{chat_id}/messages", data={"text": "next"})).is_redirect


async def test_delete_on_one_process_removes_a_chat_whose_run_the_other_executes(
    postgres_dsn: str,
):
    model = ScriptedModel([NUMBERS], chunk_delay=0.05)
    async with two_processes(postgres_dsn, {"model": model}, {"model": ScriptedModel([])}) as (
        a,
        b,
    ):
        chat_id = await new_chat(a)
        url = await live_reply_url(a, chat_id, "count")
        await read_events(b, url, {}, limit=3)
        deleted = await b.post(f"/chats/{chat_id}/delete")
        assert deleted.status_code == 303
        for http in (a, b):
            assert (await http.get(f"/chats/{chat_id}")).status_code == 404
        conn = await asyncpg.connect(postgres_dsn)
        try:
            for table, column in (
                ("chats", "id"),
                ("session_segments", "session_id"),
                ("chat_runs", "chat_id"),
                ("run_leases", "chat_id"),
            ):
                left = await conn.fetchval(
                    f"SELECT count(*) FROM {table} WHERE {column} = $1", chat_id
                )
                assert left == 0, table
            assert await conn.fetchval("SELECT count(*) FROM checkpoint_heads") == 0
        finally:
            await conn.close()


async def test_versions_change_from_either_process(postgres_dsn: str):
    async with two_processes(
        postgres_dsn,
        {"model": ScriptedModel(["first answer"])},
        {"model": ScriptedModel(["second answer"])},
    ) as (a, b):
        chat_id = await new_chat(a)
        await a.post(f"/chats/{chat_id}/messages", data={"text": "question"})

        async def idle() -> bool:
            return await active_run(postgres_dsn, chat_id) is None

        await eventually(idle, 10, "the first reply")
        # B regenerates (B's model answers); A then switches back to the first version.
        assert (await b.post(f"/chats/{chat_id}/regenerate")).status_code == 303
        await eventually(idle, 10, "the second reply")
        page = parse_html((await a.get(f"/chats/{chat_id}")).text)
        assert replies(page)[0].find(class_="content").norm_text() == "second answer"
        button = replies(page)[0].find("button", aria_label="Previous version")
        run = form_of(button).find("input", name="run_id").attrs["value"] or ""
        moved = await a.post(f"/chats/{chat_id}/switch", data={"run_id": run})
        assert moved.status_code == 303
        page = parse_html((await b.get(f"/chats/{chat_id}")).text)
        assert replies(page)[0].find(class_="content").norm_text() == "first answer"


async def test_a_run_whose_lease_passes_elsewhere_stops_here_and_is_recorded_once(
    postgres_dsn: str,
):
    # The offline model: the takeover continues the text saved before the lease was
    # lost (SPEC §6), and it goes on counting from the next number.
    app = create_app(postgres_dsn, model=OfflineModel(delay=0.05))
    async with serve(app) as base, httpx.AsyncClient(base_url=base, timeout=20) as http:
        chat_id = await new_chat(http)
        url = await live_reply_url(http, chat_id, "count to 80")
        run_id = url.split("/runs/")[1].split("/")[0]
        await read_events(http, url, {}, limit=3)
        conn = await asyncpg.connect(postgres_dsn)
        try:
            # Another process takes the lease (as if this one had stalled past its expiry).
            await conn.execute(
                "UPDATE run_leases SET owner = 'elsewhere', expires_at = now() + interval "
                "'1 hour' WHERE run_id = $1",
                run_id,
            )
            state = app.state.web.runs.get(run_id)

            async def given_up() -> bool:
                return state.finished and state.abandoned

            await eventually(given_up, 10, "the run to be given up at the next renewal")
            # Nothing was recorded here: the run is still owed, to the lease's holder.
            assert await active_run(postgres_dsn, chat_id) == run_id
            assert (
                await conn.fetchval(
                    "SELECT count(*) FROM session_segments WHERE session_id = $1", chat_id
                )
                == 0
            )
            # The holder dies without a word: the lease expires, and the run is taken
            # over (here by the same process) and recorded exactly once.
            await conn.execute("UPDATE run_leases SET expires_at = now() - interval '1 second'")

            async def idle() -> bool:
                return await active_run(postgres_dsn, chat_id) is None

            await eventually(idle, 20, "the run to be taken over and finished")
            rows = await conn.fetch(
                "SELECT run_id, entries_json FROM session_segments WHERE session_id = $1", chat_id
            )
            assert [r[0] for r in rows] == [run_id]
        finally:
            await conn.close()
        page = parse_html((await http.get(f"/chats/{chat_id}")).text)
        assert [r.find(class_="content").norm_text() for r in replies(page)] == [NUMBERS]
