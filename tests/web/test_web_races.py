"""Races found by trying the app as an attacker would; each test pins one of them.

Requests are fired together with ``asyncio.gather`` against the app in process,
so they interleave at every await exactly as two requests arriving within a
millisecond do.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from webhelpers import MakeClient

from webapp.chats.users import EVERY_CHAT
from webapp.models import ScriptedModel
from webapp.stores.checkpoint import RunHead
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.stores.sqlite_session import SQLiteSession
from webapp.transcript import AssistantEntry, UserEntry
from webapp.usage import Usage

WORDS = " ".join(f"w{i}" for i in range(1, 60))


def count_rows(db: Path, table: str) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


async def test_send_and_delete_at_once_leave_nothing_of_the_chat(
    web_client_factory: MakeClient,
):
    # Regression: both succeeded, and the run the send started went on to write
    # a segment (or leave a checkpoint) for a chat that no longer existed.
    client = await web_client_factory(model=ScriptedModel([WORDS] * 40, chunk_delay=0.005))
    statuses = set()
    for round_ in range(12):
        chat_id = await client.new_chat()
        sent, deleted = await asyncio.gather(
            client.send(chat_id, f"round {round_}", client_id=f"r{round_}"),
            client.http.post(f"/chats/{chat_id}/delete"),
        )
        statuses.add((sent.status_code, deleted.status_code))
        assert deleted.status_code == 303
        assert await client.web.chats.get(EVERY_CHAT, chat_id) is None
    await asyncio.sleep(0.5)  # any run that escaped the delete would write by now
    for table in ("chats", "sends", "session_segments", "checkpoint_heads", "checkpoint_entries"):
        assert count_rows(client.db, table) == 0, table
    # The send either landed first (303, then deleted with the chat) or found no chat.
    assert statuses <= {(303, 303), (404, 303)}


async def test_a_restart_removes_what_a_crash_left_of_deleted_chats(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    first = await web_client_factory(db=db, model=ScriptedModel(["kept reply"]))
    kept = await first.new_chat()
    await first.send(kept, "keep me")
    await first.wait_idle(kept)
    # What an older version (or a crash in one) could leave: a session and a
    # checkpoint that no chat owns.
    async with SQLiteSession(db, wal=True) as session:
        await session.append("gone-chat", [UserEntry("orphan"), AssistantEntry("x")], run_id="r1")
    async with SQLiteCheckpointer(db, wal=True) as checkpointer:
        await checkpointer.append("r1", [UserEntry("orphan")], RunHead("assistant", Usage(), 0))
    second = await web_client_factory(db=db, model=ScriptedModel([]))
    assert await second.web.session.segments("gone-chat") == []
    assert await second.web.checkpointer.load("r1") is None
    segments = await second.web.session.segments(kept)
    assert [s.entries for s in segments] == [[UserEntry("keep me"), AssistantEntry("kept reply")]]


async def test_the_first_message_posted_twice_makes_one_chat_and_one_run(
    web_client_factory: MakeClient,
):
    # Regression: a double click (or a retried POST) on the home page created two
    # or three chats and runs.
    client = await web_client_factory(model=ScriptedModel(["only once"] * 3, chunk_delay=0.01))
    form = {"text": "hello", "client_id": "home-1"}
    responses = await asyncio.gather(*(client.http.post("/chats", data=form) for _ in range(3)))
    assert [r.status_code for r in responses] == [303, 303, 303]
    locations = {r.headers["location"] for r in responses}
    assert len(locations) == 1  # the retries land on the chat the first one made
    chat_id = locations.pop().rsplit("/", 1)[1]
    await client.wait_idle(chat_id)
    assert len(await client.web.chats.recent(EVERY_CHAT)) == 1
    assert count_rows(client.db, "sends") == 1
    segments = await client.web.session.segments(chat_id)
    assert [s.entries for s in segments] == [[UserEntry("hello"), AssistantEntry("only once")]]
    # A retry much later still lands there and starts nothing.
    again = await client.http.post("/chats", data=form)
    assert again.headers["location"] == f"/chats/{chat_id}"
    assert len(await client.web.session.segments(chat_id)) == 1


async def test_regenerate_while_the_only_reply_streams_is_busy(web_client_factory: MakeClient):
    # Regression: answered 400 "nothing to regenerate" instead of 409.
    client = await web_client_factory(model=ScriptedModel([WORDS], chunk_delay=0.02))
    chat_id = await client.new_chat()
    await client.send(chat_id, "talk")
    await client.wait_text(chat_id, 4)
    response = await client.http.post(f"/chats/{chat_id}/regenerate")
    assert response.status_code == 409
    assert "still running" in response.text


async def test_concurrent_regenerates_start_one_run_and_the_rest_are_busy(
    web_client_factory: MakeClient,
):
    # Regression: three at once gave one 303 and two 400s.
    client = await web_client_factory(
        model=ScriptedModel([WORDS, WORDS, WORDS, WORDS], chunk_delay=0.02)
    )
    chat_id = await client.new_chat()
    await client.send(chat_id, "talk")
    await client.wait_text(chat_id, 4)
    run_id = await client.active_run(chat_id)
    await client.http.post(f"/chats/{chat_id}/runs/{run_id}/stop")
    responses = await asyncio.gather(
        *(client.http.post(f"/chats/{chat_id}/regenerate") for _ in range(3))
    )
    assert sorted(r.status_code for r in responses) == [303, 409, 409]
    await client.http.post(f"/chats/{chat_id}/runs/{await client.active_run(chat_id)}/stop")
    assert len(await client.web.session.segments(chat_id)) == 1
