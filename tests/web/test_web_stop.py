"""Flow 2, Stop: what the user saw is stored under the run's own id; nothing is left owed."""

from __future__ import annotations

import asyncio

from webhelpers import (
    HX,
    MakeClient,
    buttons,
    messages,
    parse_html,
    replies,
    reply_text,
)

from webapp.chats.users import EVERY_CHAT
from webapp.models import ScriptedModel
from webapp.runtime.agent import Agent
from webapp.runtime.tool import tool
from webapp.transcript import AssistantEntry, ToolCallEntry, ToolResultEntry, UserEntry

ON_BOTH_DATABASES = True  # every test here that builds the app runs on SQLite and PostgreSQL

WORDS = " ".join(f"w{i}" for i in range(1, 200))


async def test_stop_keeps_the_partial_text_under_the_run_id(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([WORDS, "next reply"], chunk_delay=0.02))
    chat_id = await client.new_chat()
    await client.send(chat_id, "talk")
    await client.wait_text(chat_id, 12)
    run_id = await client.active_run(chat_id)
    assert run_id is not None
    page = await client.page(chat_id)
    stop_button = buttons(page, "Stop")
    assert len(stop_button) == 1
    # Without JavaScript nothing streams, so the page reloads itself until the end.
    refresh = page.find("head").find("noscript").find("meta")
    assert refresh.attrs["http-equiv"] == "refresh"
    assert replies(page)[0].attrs["aria-busy"] == "true"
    response = await client.http.post(f"/chats/{chat_id}/runs/{run_id}/stop")
    assert response.status_code == 303
    # The answer came after the stop was complete: nothing is owed any more.
    chat = await client.web.chats.get(EVERY_CHAT, chat_id)
    assert chat is not None and chat.active_run_id is None and chat.stop_requested_run_id is None
    assert await client.web.checkpointer.load(run_id) is None
    segments = await client.web.session.segments(chat_id)
    assert len(segments) == 1
    stopped = segments[0]
    assert stopped.run_id == run_id
    assert stopped.meta == {"status": "stopped"}
    assert stopped.entries[0] == UserEntry("talk")
    assert len(stopped.entries) == 2 and isinstance(stopped.entries[1], AssistantEntry)
    partial = stopped.entries[1].text
    assert len(partial) >= 12 and WORDS.startswith(partial) and partial != WORDS
    # The page shows it stopped, with the same text, and no Stop button; after reload too.
    for _ in range(2):
        page = await client.page(chat_id)
        reply = replies(page)[0]
        assert reply.attrs["data-run-id"] == run_id
        assert reply.attrs["data-status"] == "stopped"
        assert reply.find(class_="status-label").norm_text() == "Stopped"
        assert reply_text(reply) == " ".join(partial.split())
        assert buttons(page, "Stop") == []
        assert page.find("head").find_all("noscript") == [] and "aria-busy" not in reply.attrs
    # The next message works and sees the stopped exchange as history.
    await client.send(chat_id, "go on")
    await client.wait_idle(chat_id)
    segments = await client.web.session.segments(chat_id)
    assert len(segments) == 2
    assert reply_text(replies(await client.page(chat_id))[1]) == "next reply"


async def test_htmx_stop_answers_with_the_stopped_reply(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([WORDS], chunk_delay=0.02))
    chat_id = await client.new_chat()
    await client.send(chat_id, "talk")
    await client.wait_text(chat_id, 6)
    run_id = await client.active_run(chat_id)
    response = await client.http.post(f"/chats/{chat_id}/runs/{run_id}/stop", headers=HX)
    assert response.status_code == 200
    fragment = parse_html(response.text)
    reply = fragment.find(data_role="assistant")
    assert reply.attrs["data-status"] == "stopped"
    assert "sse-connect" not in reply.attrs
    assert buttons(fragment, "Stop") == []
    # The stopped reply carries its own actions.
    for name in ("Regenerate", "Continue", "Branch", "Copy"):
        assert len(buttons(reply, name)) == 1, name
    # A "still running" alert shown earlier is cleared, out of band, now that it is over.
    alert = fragment.find(id="composer-alert")
    assert alert.attrs["hx-swap-oob"] == "true" and alert.text() == ""


async def test_stop_on_a_finished_run_is_a_harmless_no_op(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["all done"]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "hi")
    await client.wait_idle(chat_id)
    run_id = (await client.web.session.segments(chat_id))[0].run_id
    response = await client.http.post(f"/chats/{chat_id}/runs/{run_id}/stop")
    assert response.status_code == 303
    response = await client.http.post(f"/chats/{chat_id}/runs/{run_id}/stop", headers=HX)
    assert response.status_code == 200
    assert parse_html(response.text).find(data_role="assistant").attrs["data-status"] == (
        "completed"
    )
    segments = await client.web.session.segments(chat_id)
    assert len(segments) == 1 and segments[0].meta is None


async def test_stop_during_a_tool_drops_the_unanswered_call(web_client_factory: MakeClient):
    started = asyncio.Event()

    @tool
    async def slow_lookup(query: str) -> str:
        """Look something up, slowly."""
        started.set()
        await asyncio.sleep(30)
        return "never"

    @tool
    def quick(query: str) -> str:
        """Answer at once."""
        return f"quick:{query}"

    model = ScriptedModel(
        [[("quick", {"query": "a"})], [("slow_lookup", {"query": "b"})], "unreachable"]
    )
    agent = Agent("assistant", model=model, tools=[quick, slow_lookup])
    client = await web_client_factory(agent=agent)
    chat_id = await client.new_chat()
    await client.send(chat_id, "look up b")
    await asyncio.wait_for(started.wait(), 10)
    run_id = await client.active_run(chat_id)
    response = await client.http.post(f"/chats/{chat_id}/runs/{run_id}/stop")
    assert response.status_code == 303
    entries = (await client.web.session.segments(chat_id))[0].entries
    # The finished tool call and its result are kept; the interrupted call is dropped.
    assert [type(e) for e in entries] == [UserEntry, ToolCallEntry, ToolResultEntry]
    assert isinstance(entries[1], ToolCallEntry) and entries[1].name == "quick"
    assert entries[2] == ToolResultEntry(entries[1].call_id, "quick:a")
    page = await client.page(chat_id)
    cards = replies(page)[0].find_all(data_role="tool")
    assert [c.find(class_="tool-name").text() for c in cards] == ["quick"]
    assert [m.attrs["data-role"] for m in messages(page)] == ["user", "assistant"]
