"""Tools that ask first, in the web app (SPEC §11): the card, the decisions, Stop, 409s,
restarts and crashes; every check reads what the page shows and what the database holds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from webhelpers import (
    HX,
    Node,
    WebClient,
    buttons,
    eventually,
    form_of,
    parse_html,
    replies,
    sqlite_chats_schema_as_of,
)

from webapp.chats.store import EVERY_CHAT, ChatStore, NewRun
from webapp.models import ScriptedModel
from webapp.models.long_results import MAX_RESULT_CHARS
from webapp.runtime.agent import Agent
from webapp.runtime.approvals import DECLINED
from webapp.runtime.tool import tool
from webapp.stores.checkpoint import RunHead
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.transcript import ToolCallEntry, ToolResultEntry, UserEntry
from webapp.web import create_app


class Notes:
    """A tool that must not run twice by itself, and what it really did."""

    def __init__(self) -> None:
        self.written: list[str] = []

        @tool(approval="ask", rerunnable=False)
        def write_note(text: str) -> str:
            """Append a line to the notes."""
            self.written.append(text)
            return f"wrote {text!r}"

        self.tool = write_note


def note_agent(notes: Notes, *turns: Any) -> Agent:
    script = turns or ([("write_note", {"text": "hello"})], "The note is written.")
    return Agent("assistant", model=ScriptedModel(list(script)), tools=[notes.tool])


@contextlib.asynccontextmanager
async def running(db: Path, **kwargs: Any) -> AsyncIterator[WebClient]:
    """One app over ``db`` from start-up to shutdown: a restart is a second one."""
    app = create_app(db, **kwargs)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
    ):
        yield WebClient(app, http, db)


async def waiting_run(client: WebClient, chat_id: str) -> str:
    """Wait until the chat's run waits for a decision; its run id."""
    found = ""

    async def paused() -> bool:
        nonlocal found
        chat = await client.web.chats.get(EVERY_CHAT, chat_id)
        found = (chat.active_run_id if chat else None) or ""
        return bool(found) and found in await client.web.store.approvals.paused()

    await eventually(paused, 10, "the run to wait for approval")
    return found


def cards(page: Node) -> list[Node]:
    return page.find_all(data_role="tool")


def decision_form(card: Node, name: str) -> dict[str, str]:
    """The fields the card's button ``name`` posts, and where."""
    [button] = buttons(card, name)
    form = form_of(button)
    fields = {i.attrs["name"] or "": i.attrs["value"] or "" for i in form.find_all("input")}
    return {"action": form.attrs["action"] or "", **fields}


async def press(client: WebClient, card: Node, name: str, *, htmx: bool = True) -> httpx.Response:
    form = decision_form(card, name)
    action = form.pop("action")
    return await client.http.post(action, data=form, headers=HX if htmx else None)


def chat_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("chat-run-")]


async def test_a_call_that_asks_pauses_the_run_and_shows_its_card(tmp_path: Path):
    notes = Notes()
    async with running(tmp_path / "chat.db", agent=note_agent(notes)) as client:
        chat_id = await client.new_chat()
        await client.send(chat_id, "note hello")
        run_id = await waiting_run(client, chat_id)
        page = await client.page(chat_id)
        [reply] = replies(page)
        assert reply.attrs["data-status"] == "waiting"
        assert reply.attrs["data-run-id"] == run_id
        assert "sse-connect" not in reply.attrs  # nothing streams while it waits
        [card] = cards(reply)
        assert card.attrs["data-approval"] == "waiting"
        assert "Waiting for approval" in card.norm_text()
        assert "may have run already" not in card.norm_text()
        assert json.loads(card.find(class_="tool-args").text()) == {"text": "hello"}
        for name in ("Allow", "Always allow", "Deny"):
            form = form_of(buttons(card, name)[0])
            assert form.attrs["method"] == "post"
            assert form.attrs["action"] == f"/chats/{chat_id}/runs/{run_id}/decide"
        assert buttons(reply, "Stop") and not buttons(reply, "Regenerate")
        # Nothing ran, nothing waits in memory, and the chat still owes the run.
        assert notes.written == []
        assert chat_tasks() == []
        snapshot = await client.web.checkpointer.load(run_id)
        assert snapshot is not None and snapshot.status == "interrupted"
        assert await client.active_run(chat_id) == run_id


async def test_allow_runs_the_call_once_and_the_reply_goes_on(tmp_path: Path):
    notes = Notes()
    db = tmp_path / "chat.db"
    async with running(db, agent=note_agent(notes)) as client:
        chat_id = await client.new_chat()
        await client.send(chat_id, "note hello")
        run_id = await waiting_run(client, chat_id)
        [card] = cards(await client.page(chat_id))
        answered = await press(client, card, "Allow")
        assert answered.status_code == 200
        [reply] = replies(parse_html(answered.text))  # the reply, streaming on from here
        assert reply.attrs["data-run-id"] == run_id
        assert "sse-connect" in reply.attrs or reply.attrs["data-status"] == "completed"
        await client.wait_idle(chat_id)
        assert notes.written == ["hello"]
        [reply] = replies(await client.page(chat_id))
        assert reply.attrs["data-status"] == "completed"
        assert reply.find(class_="content").norm_text() == "The note is written."
        [card] = cards(reply)
        assert card.find(class_="approval-label").norm_text() == "Allowed"
        assert card.find(class_="tool-result").text() == "wrote 'hello'"
        assert not buttons(card, "Allow")
    # The card says it after a restart too (the decision is in the chat database).
    async with running(db, agent=note_agent(Notes())) as client:
        [card] = cards(await client.page(chat_id))
        assert card.find(class_="approval-label").norm_text() == "Allowed"


async def test_deny_gives_the_model_the_declined_result(tmp_path: Path):
    notes = Notes()
    agent = note_agent(notes, [("write_note", {"text": "secret"})], "I did not write it.")
    async with running(tmp_path / "chat.db", agent=agent) as client:
        chat_id = await client.new_chat()
        await client.send(chat_id, "note secret")
        await waiting_run(client, chat_id)
        [card] = cards(await client.page(chat_id))
        assert (await press(client, card, "Deny", htmx=False)).status_code == 303
        await client.wait_idle(chat_id)
        assert notes.written == []
        model = agent.model
        assert isinstance(model, ScriptedModel)
        results = [e for e in model.requests[-1] if isinstance(e, ToolResultEntry)]
        assert [(r.output, r.is_error) for r in results] == [(DECLINED, True)]
        [reply] = replies(await client.page(chat_id))
        [card] = cards(reply)
        assert card.find(class_="approval-label").norm_text() == "Denied"
        assert card.attrs["data-error"] == "true"
        assert reply.find(class_="content").norm_text() == "I did not write it."


async def test_always_allow_runs_the_tool_unasked_in_that_chat_only(tmp_path: Path):
    notes = Notes()
    turns = [
        [("write_note", {"text": "one"})],
        "One.",
        [("write_note", {"text": "two"})],
        "Two.",
        [("write_note", {"text": "three"})],
    ]
    async with running(tmp_path / "chat.db", agent=note_agent(notes, *turns)) as client:
        chat_id = await client.new_chat()
        await client.send(chat_id, "note one")
        await waiting_run(client, chat_id)
        [card] = cards(await client.page(chat_id))
        await press(client, card, "Always allow")
        await client.wait_idle(chat_id)
        assert await client.web.store.approvals.grants(chat_id) == {"write_note"}
        # The same chat: it runs without asking.
        await client.send(chat_id, "note two")
        await client.wait_idle(chat_id)
        assert notes.written == ["one", "two"]
        first, second = replies(await client.page(chat_id))
        assert cards(first)[0].find(class_="approval-label").norm_text() == "Allowed"
        assert "data-approval" not in cards(second)[0].attrs  # it never asked
        # Another chat asks again.
        other = await client.new_chat()
        await client.send(other, "note three")
        await waiting_run(client, other)
        assert notes.written == ["one", "two"]


async def test_while_it_waits_the_other_operations_answer_409(tmp_path: Path):
    notes = Notes()
    async with running(tmp_path / "chat.db", agent=note_agent(notes)) as client:
        chat_id = await client.new_chat()
        await client.send(chat_id, "note hello")
        run_id = await waiting_run(client, chat_id)
        assert (await client.send(chat_id, "another")).status_code == 409
        assert (await client.send(chat_id, "another", htmx=True)).status_code == 409
        regenerate = await client.http.post(f"/chats/{chat_id}/regenerate")
        assert regenerate.status_code == 409
        edit = await client.http.post(
            f"/chats/{chat_id}/messages/{run_id}/edit", data={"text": "edited"}
        )
        assert edit.status_code == 409
        assert await client.active_run(chat_id) == run_id
        assert notes.written == []


async def test_stop_while_it_waits_keeps_a_stopped_reply_without_the_call(tmp_path: Path):
    notes = Notes()
    agent = note_agent(notes, [("write_note", {"text": "x"})], "Next answer.")
    async with running(tmp_path / "chat.db", agent=agent) as client:
        chat_id = await client.new_chat()
        await client.send(chat_id, "note x")
        run_id = await waiting_run(client, chat_id)
        stopped = await client.http.post(f"/chats/{chat_id}/runs/{run_id}/stop", headers=HX)
        assert stopped.status_code == 200
        [reply] = replies(parse_html(stopped.text))
        assert reply.attrs["data-status"] == "stopped"
        assert cards(reply) == []  # the waiting call is dropped with its card
        assert await client.active_run(chat_id) is None
        assert await client.web.checkpointer.load(run_id) is None
        assert await client.web.store.approvals.paused() == set()
        [segment] = await client.web.session.segments(chat_id)
        assert segment.run_id == run_id and segment.entries == [UserEntry("note x")]
        assert segment.meta == {"status": "stopped"}
        # The chat takes the next message at once; the call never ran.
        assert (await client.send(chat_id, "go on")).status_code == 303
        await client.wait_idle(chat_id)
        assert notes.written == []


async def test_a_restart_while_it_waits_shows_the_card_and_a_decision_then_runs_once(
    tmp_path: Path,
):
    db = tmp_path / "chat.db"
    first = Notes()
    async with running(db, agent=note_agent(first)) as client:
        chat_id = await client.new_chat()
        await client.send(chat_id, "note hello")
        run_id = await waiting_run(client, chat_id)
    notes = Notes()
    agent = note_agent(notes, "The note is written.")  # the resume's only model turn
    async with running(db, agent=agent) as client:
        page = await client.page(chat_id)
        [reply] = replies(page)
        assert reply.attrs["data-status"] == "waiting"
        message = page.find_all(data_role="user")[0].find(class_="content")
        assert message.norm_text().startswith("note hello")
        # Waiting costs nothing: no task, no model call, no tool call.
        assert chat_tasks() == []
        assert isinstance(agent.model, ScriptedModel) and agent.model.requests == []
        [card] = cards(reply)
        await asyncio.gather(*(press(client, card, "Allow") for _ in range(5)))
        await client.wait_idle(chat_id)
        assert (first.written, notes.written) == ([], ["hello"])
        [reply] = replies(await client.page(chat_id))
        assert reply.attrs["data-run-id"] == run_id
        assert reply.find(class_="content").norm_text() == "The note is written."
        # A late click on the finished reply changes nothing.
        late = await press(client, card, "Allow")
        assert late.status_code == 200 and notes.written == ["hello"]
        assert replies(parse_html(late.text))[0].attrs["data-status"] == "completed"


async def test_a_decision_recorded_before_a_crash_is_applied_by_the_restart(tmp_path: Path):
    db = tmp_path / "chat.db"
    async with running(db, agent=note_agent(Notes())) as client:
        chat_id = await client.new_chat()
        await client.send(chat_id, "note hello")
        run_id = await waiting_run(client, chat_id)
        [card] = cards(await client.page(chat_id))
        call_id = decision_form(card, "Allow")["call_id"]
        # The click's transaction committed; the process died before it resumed the run.
        await client.web.store.approvals.decide(chat_id, run_id, {call_id: "allow"})
    notes = Notes()
    async with running(db, agent=note_agent(notes, "The note is written.")) as client:
        await client.wait_idle(chat_id)
        assert notes.written == ["hello"]
        [card] = cards(await client.page(chat_id))
        assert card.find(class_="approval-label").norm_text() == "Allowed"


async def test_a_crash_during_a_call_that_must_not_rerun_asks_again(tmp_path: Path):
    db = tmp_path / "chat.db"
    call = ToolCallEntry("call_1", "write_note", '{"text": "maybe"}')
    chats, checkpoints = ChatStore(db), SQLiteCheckpointer(db, wal=True)
    try:
        chat = await chats.create(EVERY_CHAT, "crashed")
        run_id = "0e" * 16
        await chats.begin_run(chat.id, NewRun(run_id, input="note maybe", owner=EVERY_CHAT))
        # What a process killed inside write_note leaves: the call marked started.
        head = RunHead("assistant", turns=1, session_id=chat.id, started=["call_1"])
        await checkpoints.append(run_id, [UserEntry("note maybe"), call], head)
    finally:
        await chats.close()
        await checkpoints.close()
    notes = Notes()
    async with running(db, agent=note_agent(notes, "Written again.")) as client:
        await waiting_run(client, chat.id)
        [card] = cards(await client.page(chat.id))
        assert card.attrs["data-approval"] == "waiting"
        assert "may have run already" in card.norm_text()
        assert notes.written == []  # not re-run by itself
        await press(client, card, "Allow")
        await client.wait_idle(chat.id)
        assert notes.written == ["maybe"]


async def test_a_huge_result_is_cut_for_the_model_and_kept_whole_for_the_user(tmp_path: Path):
    @tool
    def dump() -> str:
        """A very long text."""
        return "x" * (MAX_RESULT_CHARS * 3)

    model = ScriptedModel([[("dump", {})], "Done."])
    agent = Agent("assistant", model=model, tools=[dump])
    async with running(tmp_path / "chat.db", agent=agent) as client:
        chat_id = await client.new_chat()
        await client.send(chat_id, "dump")
        await client.wait_idle(chat_id)
        [sent] = [e for e in model.requests[1] if isinstance(e, ToolResultEntry)]
        assert sent.output.startswith("x" * MAX_RESULT_CHARS + "\n[The tool's result was cut")
        assert f"{MAX_RESULT_CHARS * 2:,} more characters are not shown to you" in sent.output
        [segment] = await client.web.session.segments(chat_id)
        [kept] = [e for e in segment.entries if isinstance(e, ToolResultEntry)]
        assert kept.output == "x" * (MAX_RESULT_CHARS * 3)
        [card] = cards(await client.page(chat_id))
        assert card.find(class_="tool-result").text() == kept.output


async def test_deleting_a_chat_while_it_waits_leaves_nothing(tmp_path: Path):
    db = tmp_path / "chat.db"
    async with running(
        db, agent=note_agent(Notes(), *[[("write_note", {"text": "a"})]] * 2)
    ) as client:
        chat_id = await client.new_chat()
        await client.send(chat_id, "note a")
        await waiting_run(client, chat_id)
        await client.web.store.approvals.decide(chat_id, "other-run", {"c": "allow"}, grant="x")
        assert (await client.http.post(f"/chats/{chat_id}/delete")).status_code == 303
        assert (await client.http.get(f"/chats/{chat_id}")).status_code == 404
    with sqlite3.connect(db) as conn:
        for table in ("paused_runs", "tool_decisions", "tool_grants", "checkpoint_heads"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table


async def test_a_chat_database_from_before_approvals_gains_their_tables(tmp_path: Path):
    db = tmp_path / "chat.db"
    store = ChatStore(db)
    chat = await store.create(EVERY_CHAT, "old")
    await store.close()
    with sqlite3.connect(db) as conn:  # the file as version 9 left it (models, before approvals)
        sqlite_chats_schema_as_of(conn, 9)
    notes = Notes()
    async with running(db, agent=note_agent(notes)) as client:
        await client.send(chat.id, "note hello")
        await waiting_run(client, chat.id)
        [card] = cards(await client.page(chat.id))
        await press(client, card, "Allow")
        await client.wait_idle(chat.id)
        assert notes.written == ["hello"]
