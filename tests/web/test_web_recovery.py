"""Start-up recovery: every run the database says is owed is resumed, finished or cleared."""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx
from webhelpers import MakeClient, buttons, eventually, parse_html, replies

from webapp.chats.store import ChatStore, NewRun
from webapp.chats.users import EVERY_CHAT
from webapp.models import ScriptedModel
from webapp.stores.checkpoint import RunHead
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.stores.sqlite_session import SQLiteSession
from webapp.stores.streamed import StreamedPiece
from webapp.transcript import (
    AssistantEntry,
    Entry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
)
from webapp.web import create_app
from webapp.web.app_state import WebApp

RUN = "0f" * 16


async def leave_behind(
    db: Path,
    entries: list[Entry],
    status: str = "running",
    *,
    stop_requested: bool = False,
    error: str | None = None,
    checkpoint: bool = True,
    input: str | None = None,
    finish_reason: str | None = None,
    model: str | None = None,
) -> str:
    """What a server killed mid-run leaves in the file; returns the chat id."""
    chats = ChatStore(db)
    cp = SQLiteCheckpointer(db, wal=True)
    try:
        chat = await chats.create(EVERY_CHAT, "crashed chat")
        await chats.begin_run(chat.id, NewRun(RUN, input=input, model=model, owner=EVERY_CHAT))
        if stop_requested:
            await chats.request_stop(chat.id, RUN)
        if checkpoint:
            head = RunHead(
                "assistant",
                turns=1,
                status=status,  # type: ignore[arg-type]
                error=error,
                session_id=chat.id,
                finish_reason=finish_reason,
            )
            await cp.append(RUN, entries, head)
    finally:
        await chats.close()
        await cp.close()
    return chat.id


async def test_a_running_checkpoint_is_resumed_and_completes(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    chat_id = await leave_behind(db, [UserEntry("count please")])
    model = ScriptedModel(["one two three four five six"], chunk_delay=0.05)
    client = await web_client_factory(db=db, model=model)
    # The chat shows it streaming under the same run id ...
    page = await client.page(chat_id)
    reply = replies(page)[0]
    assert reply.attrs["data-run-id"] == RUN
    assert reply.attrs["data-status"] == "streaming"
    assert len(page.find_all(data_role="user")) == 1
    # ... and it completes into exactly one segment under that id.
    await client.wait_idle(chat_id)
    segments = await client.web.session.segments(chat_id)
    assert len(segments) == 1
    assert segments[0].run_id == RUN
    assert segments[0].entries == [
        UserEntry("count please"),
        AssistantEntry("one two three four five six"),
    ]
    assert await client.web.checkpointer.load(RUN) is None
    assert model.requests == [[UserEntry("count please")]]
    reply = replies(await client.page(chat_id))[0]
    assert reply.attrs["data-status"] == "completed"


async def test_resume_reruns_a_tool_call_left_without_result(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    call = ToolCallEntry("call_1", "calculator", '{"expression": "12*(3+4)"}')
    chat_id = await leave_behind(db, [UserEntry("what is 12*(3+4)?"), call])
    client = await web_client_factory(db=db, model=ScriptedModel(["It is 84."]))
    await client.wait_idle(chat_id)
    entries = (await client.web.session.segments(chat_id))[0].entries
    assert entries == [
        UserEntry("what is 12*(3+4)?"),
        call,
        ToolResultEntry("call_1", "84"),
        AssistantEntry("It is 84."),
    ]
    card = replies(await client.page(chat_id))[0].find(data_role="tool")
    assert card.find(class_="tool-result").text() == "84"


async def test_a_stop_interrupted_by_a_crash_is_finished(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    call = ToolCallEntry("call_1", "calculator", '{"expression": "1+1"}')
    entries: list[Entry] = [UserEntry("hi"), AssistantEntry("partial"), call]
    chat_id = await leave_behind(db, entries, "interrupted", stop_requested=True)
    model = ScriptedModel([])  # must not be called: the user stopped this run
    client = await web_client_factory(db=db, model=model)
    segments = await client.web.session.segments(chat_id)
    assert len(segments) == 1
    assert segments[0].run_id == RUN
    assert segments[0].meta == {"status": "stopped"}
    assert segments[0].entries == [UserEntry("hi"), AssistantEntry("partial")]
    assert await client.web.checkpointer.load(RUN) is None
    assert await client.active_run(chat_id) is None
    assert model.requests == []
    reply = replies(await client.page(chat_id))[0]
    assert reply.attrs["data-status"] == "stopped"


async def test_a_failed_checkpoint_is_recorded_as_failed(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    chat_id = await leave_behind(db, [UserEntry("hi")], "failed", error="ModelError: boom")
    client = await web_client_factory(db=db, model=ScriptedModel([]))
    segments = await client.web.session.segments(chat_id)
    assert segments[0].entries == [UserEntry("hi")]
    assert segments[0].meta == {"status": "failed", "error": "ModelError: boom"}
    assert await client.active_run(chat_id) is None
    reply = replies(await client.page(chat_id))[0]
    assert reply.attrs["data-status"] == "failed"
    assert "boom" in reply.find(role="alert").norm_text()


async def test_a_missing_checkpoint_clears_the_run(web_client_factory: MakeClient, tmp_path: Path):
    db = tmp_path / "chat.db"
    chat_id = await leave_behind(db, [], checkpoint=False)
    client = await web_client_factory(db=db, model=ScriptedModel([]))
    assert await client.active_run(chat_id) is None
    assert await client.web.session.segments(chat_id) == []


async def test_a_run_killed_before_its_first_checkpoint_starts_again_from_its_input(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    chat_id = await leave_behind(db, [], checkpoint=False, input="count please")
    model = ScriptedModel(["one two three"])
    client = await web_client_factory(db=db, model=model)
    await client.wait_idle(chat_id)
    segments = await client.web.session.segments(chat_id)
    want = [UserEntry("count please"), AssistantEntry("one two three")]
    assert [(s.run_id, s.entries) for s in segments] == [(RUN, want)]  # the message is kept
    assert model.requests == [[UserEntry("count please")]]
    assert await client.web.store.run_input(RUN) is None  # gone with the finished run
    page = parse_html((await client.http.get(f"/chats/{chat_id}")).text)
    assert "count please" in page.text() and "one two three" in page.text()


async def test_a_completed_checkpoint_is_replayed_into_the_session(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    entries: list[Entry] = [UserEntry("hi"), AssistantEntry("done before the crash")]
    chat_id = await leave_behind(db, entries, "completed")
    model = ScriptedModel([])
    client = await web_client_factory(db=db, model=model)
    await client.wait_idle(chat_id)
    segments = await client.web.session.segments(chat_id)
    assert [(s.run_id, s.entries) for s in segments] == [(RUN, entries)]
    assert model.requests == []


async def test_a_cut_reply_completed_just_before_a_crash_can_still_be_continued(
    web_client_factory: MakeClient, tmp_path: Path
):
    # Killed between "checkpoint completed" and "session appended": the replay at
    # start-up stores the reply, and the head says it was cut at the output limit.
    db = tmp_path / "chat.db"
    entries: list[Entry] = [UserEntry("count to 10"), AssistantEntry("1 2 3")]
    chat_id = await leave_behind(db, entries, "completed", finish_reason="length")
    client = await web_client_factory(db=db, model=ScriptedModel([]))
    await client.wait_idle(chat_id)
    [segment] = await client.web.session.segments(chat_id)
    assert segment.meta == {"finish_reason": "length"}
    [reply] = replies(await client.page(chat_id))
    assert reply.attrs["data-status"] == "completed"
    assert len(buttons(reply, "Continue")) == 1


async def test_shutdown_mid_run_resumes_on_the_next_start(tmp_path: Path):
    db = tmp_path / "chat.db"
    words = " ".join(f"w{i}" for i in range(40))
    first = create_app(db, model=ScriptedModel([words], chunk_delay=0.02))
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(first.router.lifespan_context(first))
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=first), base_url="http://t")
        await stack.enter_async_context(http)
        chat_id = (await http.post("/chats")).headers["location"].rsplit("/", 1)[1]
        await http.post(f"/chats/{chat_id}/messages", data={"text": "talk"})

        async def streaming() -> bool:
            state = first.state.web.runs.latest(chat_id)
            return state is not None and len(state.reply.text) > 5

        await eventually(streaming, 10, "the reply to stream")
        run_id = first.state.web.runs.latest(chat_id).run_id
    shown = first.state.web.runs.latest(chat_id).reply.text  # when the server went away
    # Clients still connected during the shutdown are told to retry (the next process
    # resumes the run), never given a final reply.
    transport = httpx.ASGITransport(app=first)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        events = await http.get(f"/chats/{chat_id}/runs/{run_id}/events")
        assert events.status_code == 503
    # The server went away mid-run: nothing was written as finished, the run is owed.
    session = SQLiteSession(db, wal=True)
    cp = SQLiteCheckpointer(db, wal=True)
    assert await session.segments(chat_id) == []
    snapshot = await cp.load(run_id)
    assert snapshot is not None and snapshot.status == "interrupted"
    # Everything the reply showed was saved at the shutdown (SPEC §6): the next start
    # continues it instead of answering again.
    saved = await cp.load_streamed(run_id, 0)
    assert saved is not None and saved.text == shown and words.startswith(shown)
    await session.close()
    await cp.close()
    model = ScriptedModel([words[len(shown) :]])
    second = create_app(db, model=model)
    async with second.router.lifespan_context(second):
        web = second.state.web

        await wait_idle(web, chat_id, "the resumed run to finish")
        segments = await web.session.segments(chat_id)
        assert [(s.run_id, s.entries) for s in segments] == [
            (run_id, [UserEntry("talk"), AssistantEntry(words)])
        ]
        assert model.requests == [[UserEntry("talk"), AssistantEntry(shown)]]
        assert model.continued == [True]
        transport = httpx.ASGITransport(app=second)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            page = parse_html((await http.get(f"/chats/{chat_id}")).text)
        assert len(page.find_all(data_role="assistant")) == 1


async def test_a_crash_keeps_the_streamed_text_and_the_run_continues_it(
    web_client_factory: MakeClient, tmp_path: Path
):
    """SPEC §6: the saved text stays on screen, and the model goes on from it."""
    db = tmp_path / "chat.db"
    chat_id = await leave_behind(db, [UserEntry("count please")])
    async with SQLiteCheckpointer(db, wal=True) as cp:  # what streamed before the crash
        await cp.save_streamed(RUN, StreamedPiece(1, 0, "one two"))
        await cp.save_streamed(RUN, StreamedPiece(1, 1, " three"))
    model = ScriptedModel([" four five six"], chunk_delay=0.2)
    client = await web_client_factory(db=db, model=model)
    reply = replies(await client.page(chat_id))[0]
    assert reply.attrs["data-status"] == "streaming"
    assert reply.find(class_="content").text().startswith("one two three")
    await client.wait_idle(chat_id)
    (segment,) = await client.web.session.segments(chat_id)
    assert segment.entries == [
        UserEntry("count please"),
        AssistantEntry("one two three four five six"),
    ]
    assert model.requests == [[UserEntry("count please"), AssistantEntry("one two three")]]
    assert model.continued == [True]


async def test_a_stop_interrupted_by_a_crash_keeps_the_streamed_text(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    chat_id = await leave_behind(db, [UserEntry("hi")], "interrupted", stop_requested=True)
    async with SQLiteCheckpointer(db, wal=True) as cp:
        await cp.save_streamed(RUN, StreamedPiece(1, 0, "what the page showed"))
    model = ScriptedModel([])  # must not be called: the user stopped this run
    client = await web_client_factory(db=db, model=model)
    (segment,) = await client.web.session.segments(chat_id)
    assert segment.meta == {"status": "stopped"}
    assert segment.entries == [UserEntry("hi"), AssistantEntry("what the page showed")]
    assert model.requests == []


async def test_a_turn_that_was_calling_tools_is_redone(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    chat_id = await leave_behind(db, [UserEntry("hi")])
    async with SQLiteCheckpointer(db, wal=True) as cp:
        await cp.save_streamed(RUN, StreamedPiece(1, 0, "Let me look that up."))
        await cp.save_streamed(RUN, StreamedPiece(1, 1, calls=True))
    model = ScriptedModel(["Hello."])
    client = await web_client_factory(db=db, model=model)
    await client.wait_idle(chat_id)
    (segment,) = await client.web.session.segments(chat_id)
    assert segment.entries == [UserEntry("hi"), AssistantEntry("Hello.")]
    assert model.continued == [False]


async def test_a_continue_interrupted_by_a_shutdown_resumes_as_one_reply(tmp_path: Path):
    db = tmp_path / "chat.db"
    rest = " ".join(f"w{i}" for i in range(5, 60))
    first_model = ScriptedModel(["w1 w2 w3 w4", " " + rest], chunk_delay=0.02)
    first = create_app(db, model=first_model)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(first.router.lifespan_context(first))
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=first), base_url="http://t")
        await stack.enter_async_context(http)
        chat_id = (await http.post("/chats")).headers["location"].rsplit("/", 1)[1]
        await http.post(f"/chats/{chat_id}/messages", data={"text": "talk"})
        web = first.state.web

        async def streaming(at_least: int) -> bool:
            state = web.runs.latest(chat_id)
            return state is not None and len(state.reply.text.split()) >= at_least

        await eventually(lambda: streaming(2), 10, "the reply to stream")
        run_id = web.runs.latest(chat_id).run_id
        await http.post(f"/chats/{chat_id}/runs/{run_id}/stop")
        stopped = (await web.session.segments(chat_id))[0].entries[1].text
        await http.post(f"/chats/{chat_id}/runs/{run_id}/continue")
        await eventually(lambda: streaming(len(stopped.split()) + 5), 10, "the continuation")
    shown = first.state.web.runs.latest(chat_id).reply.text  # the reply when the server went
    second_model = ScriptedModel([rest[len(shown) - len(stopped) - 1 :]])
    second = create_app(db, model=second_model)
    async with second.router.lifespan_context(second):
        web = second.state.web

        await wait_idle(web, chat_id, "the resumed continuation to finish")
        (segment,) = await web.session.segments(chat_id)
        assert segment.run_id == run_id
        assert segment.entries == [UserEntry("talk"), AssistantEntry(stopped + " " + rest)]
        # the model saw one assistant message: the stopped text and the continuation's own
        assert second_model.requests == [[UserEntry("talk"), AssistantEntry(shown)]]
        transport = httpx.ASGITransport(app=second)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            page = parse_html((await http.get(f"/chats/{chat_id}")).text)
        (reply,) = replies(page)
        assert reply.attrs["data-run-id"] == run_id


async def wait_idle(web: WebApp, chat_id: str, what: str) -> None:
    """Until ``chat_id`` has no run in flight in the app ``web``."""

    async def idle() -> bool:
        chat = await web.chats.get(EVERY_CHAT, chat_id)
        return chat is not None and chat.active_run_id is None

    await eventually(idle, 10, what)
