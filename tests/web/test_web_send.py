"""Flow 1, Send: the message is stored with its reply; refusals keep the user's text."""

from __future__ import annotations

from typing import Any

import pytest
from webhelpers import (
    MakeClient,
    buttons,
    form_of,
    hidden_value,
    messages,
    parse_html,
    replies,
    reply_text,
    textarea_value,
)

from webapp.errors import ModelError
from webapp.models import ScriptedModel
from webapp.transcript import AssistantEntry, ToolCallEntry, ToolResultEntry, UserEntry

ON_BOTH_DATABASES = True  # every test here that builds the app runs on SQLite and PostgreSQL

SLOW = 0.05  # seconds per scripted word: long enough to act while a run streams


async def test_send_stores_one_segment_and_shows_the_reply(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["Hello **there**, friend."]))
    chat_id = await client.new_chat()
    response = await client.send(chat_id, "Hi!\r\nHow are you?", client_id="m1")
    assert response.status_code == 303
    assert response.headers["location"] == f"/chats/{chat_id}"
    await client.wait_idle(chat_id)
    segments = await client.web.session.segments(chat_id)
    assert len(segments) == 1
    assert segments[0].entries == [
        UserEntry("Hi!\nHow are you?"),
        AssistantEntry("Hello **there**, friend."),
    ]
    page = await client.page(chat_id)
    user, reply = messages(page)
    assert user.attrs["data-role"] == "user"
    assert user.find(class_="content").text() == "Hi!\nHow are you?"
    assert len(buttons(user, "Edit")) == 1
    assert reply.attrs["data-run-id"] == segments[0].run_id
    assert reply.attrs["data-status"] == "completed"
    assert reply.find("strong").text() == "there"  # Markdown rendered
    assert reply.find_all("details") == []  # no empty "Reasoning" disclosure
    assert len(buttons(page, "Regenerate")) == 1
    assert buttons(page, "Stop") == []
    # No checkpoint is left for a finished run.
    assert await client.web.checkpointer.load(segments[0].run_id) is None


async def test_htmx_send_returns_the_list_with_a_streaming_reply(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["one two three four"], chunk_delay=SLOW))
    chat_id = await client.new_chat()
    before = await client.page(chat_id)
    old_client_id = hidden_value(before, "client_id")
    response = await client.send(chat_id, "count please", client_id=old_client_id, htmx=True)
    assert response.status_code == 200
    fragment = parse_html(response.text)
    user, reply = messages(fragment)
    assert user.find(class_="content").text() == "count please"
    assert reply.attrs["data-status"] == "streaming"
    run_id = reply.attrs["data-run-id"]
    connect = reply.attrs["sse-connect"] or ""
    assert connect.startswith(f"/chats/{chat_id}/runs/{run_id}/events?after=")
    assert reply.attrs["sse-close"] == "done"
    assert len(buttons(reply, "Stop")) == 1
    # Out of band: an empty Message box, a fresh client id, no alert; no Regenerate yet.
    box = fragment.find("textarea", id="message")
    assert box.attrs["hx-swap-oob"] == "true" and box.text() == ""
    new_client_id = fragment.find("input", id="client-id").attrs["value"]
    assert new_client_id and new_client_id != old_client_id
    assert fragment.find(id="composer-alert").text() == ""
    assert buttons(fragment, "Regenerate") == []
    # The first message names the chat: the heading and the chat list follow at once.
    heading = fragment.find(id="chat-title-heading")
    assert heading.attrs["hx-swap-oob"] == "true" and heading.norm_text() == "count please"
    # Only this chat's list item comes along (not the whole list): out of its old
    # place, in at the top.
    assert fragment.find_all("nav") == []
    removed, moved = fragment.find_all(id=f"chat-item-{chat_id}")
    assert removed.attrs["hx-swap-oob"] == "delete"
    assert moved.parent is not None
    assert moved.parent.attrs["hx-swap-oob"] == "afterbegin:#chat-list-items"
    assert [a.norm_text() for a in moved.find_all("a")] == ["count please"]
    assert len(fragment.find_all("li")) == 2
    await client.wait_idle(chat_id)


async def test_a_send_reads_its_page_with_its_record(
    web_client_factory: MakeClient, monkeypatch: pytest.MonkeyPatch
):
    model = ScriptedModel(["first reply", "second reply"], chunk_delay=SLOW)
    client = await web_client_factory(model=model)
    chat_id = await client.new_chat()
    await client.send(chat_id, "one", client_id="a")
    await client.wait_idle(chat_id)
    reads: list[str] = []

    def counted(owner: object, name: str) -> None:
        real = getattr(owner, name)

        async def read(*args: Any, **kwargs: Any) -> Any:
            reads.append(name)
            return await real(*args, **kwargs)

        monkeypatch.setattr(owner, name, read)

    counted(client.web.chats.store, "get")
    counted(client.web.chats.store, "page")
    response = await client.send(chat_id, "two", client_id="b", htmx=True)
    answered = list(reads)
    assert response.status_code == 200
    shown = messages(parse_html(response.text))
    assert [m.attrs["data-role"] for m in shown] == ["user", "assistant", "user", "assistant"]
    assert reply_text(shown[1]) == "first reply"
    assert shown[2].find(class_="content").text() == "two"
    assert shown[3].attrs["data-status"] == "streaming"
    await client.wait_idle(chat_id)
    # The transaction that recorded the run was the send's check (no chat read before
    # it) and read the page: the answer showed it. The run read its history itself.
    assert answered == []
    assert [read for read in reads if read != "get"] == []  # (waiting for idle reads the chat)
    assert model.requests[-1] == [UserEntry("one"), AssistantEntry("first reply"), UserEntry("two")]
    assert [s.entries[-1] for s in await client.web.session.segments(chat_id)] == [
        AssistantEntry("first reply"),
        AssistantEntry("second reply"),
    ]


async def test_retried_send_with_the_same_client_id_starts_one_run(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["first reply", "second reply"]))
    chat_id = await client.new_chat()
    first = await client.send(chat_id, "hello", client_id="same-id")
    second = await client.send(chat_id, "hello", client_id="same-id")
    assert first.status_code == second.status_code == 303
    await client.wait_idle(chat_id)
    third = await client.send(chat_id, "hello", client_id="same-id")  # after it finished too
    assert third.status_code == 303
    await client.wait_idle(chat_id)
    segments = await client.web.session.segments(chat_id)
    assert len(segments) == 1
    assert reply_text(replies(await client.page(chat_id))[0]) == "first reply"


async def test_double_click_sends_concurrently_start_one_run(web_client_factory: MakeClient):
    import asyncio

    client = await web_client_factory(model=ScriptedModel(["only once"], chunk_delay=SLOW))
    chat_id = await client.new_chat()
    results = await asyncio.gather(
        *(client.send(chat_id, "hi", client_id="dbl", htmx=True) for _ in range(3))
    )
    assert [r.status_code for r in results] == [200, 200, 200]
    await client.wait_idle(chat_id)
    assert len(await client.web.session.segments(chat_id)) == 1


async def test_second_send_while_running_is_409_and_keeps_the_text(web_client_factory: MakeClient):
    client = await web_client_factory(
        model=ScriptedModel(["a b c d e f g h i j", "later"], chunk_delay=SLOW)
    )
    chat_id = await client.new_chat()
    await client.send(chat_id, "first", client_id="a1")
    await client.wait_text(chat_id, 2)
    # A plain form post: the whole page, with the alert and the text still in the box.
    refused = await client.send(chat_id, "second <b>message</b>", client_id="a2")
    assert refused.status_code == 409
    page = parse_html(refused.text)
    assert "still running" in page.find(id="composer-alert").norm_text()
    assert page.find(id="composer-alert").attrs["role"] == "alert"
    assert textarea_value(page, "Message") == "second <b>message</b>"
    assert len(buttons(page, "Send")) == 1  # Send stays available
    # htmx: the alert alone, retargeted next to the composer; the box is not touched.
    refused_hx = await client.send(chat_id, "second", client_id="a3", htmx=True)
    assert refused_hx.status_code == 409
    assert refused_hx.headers["HX-Retarget"] == "#composer-alert"
    assert refused_hx.headers["HX-Reswap"] == "outerHTML"
    alert = parse_html(refused_hx.text).find(role="alert")
    assert "still running" in alert.norm_text()
    await client.wait_idle(chat_id)
    segments = await client.web.session.segments(chat_id)
    assert [s.entries[0] for s in segments] == [UserEntry("first")]
    # The refused client id did not burn: the same message can be sent now.
    ok = await client.send(chat_id, "second", client_id="a2")
    assert ok.status_code == 303
    await client.wait_idle(chat_id)
    assert len(await client.web.session.segments(chat_id)) == 2


async def test_empty_message_is_400(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([]))
    chat_id = await client.new_chat()
    response = await client.send(chat_id, "   \n ")
    assert response.status_code == 400
    page = parse_html(response.text)
    assert "empty" in page.find(id="composer-alert").norm_text()
    response_hx = await client.send(chat_id, "", htmx=True)
    assert response_hx.status_code == 400
    assert "empty" in parse_html(response_hx.text).find(role="alert").norm_text()
    assert await client.web.session.segments(chat_id) == []


async def test_message_over_the_limit_is_413_and_kept(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["ok"]), max_message_chars=50)
    chat_id = await client.new_chat()
    text = "é" * 51
    response = await client.send(chat_id, text)
    assert response.status_code == 413
    page = parse_html(response.text)
    assert "limit is 50" in page.find(id="composer-alert").norm_text()
    assert textarea_value(page, "Message") == text
    hx = await client.send(chat_id, text, htmx=True)
    assert hx.status_code == 413
    assert hx.headers["HX-Retarget"] == "#composer-alert"
    # Exactly at the limit is fine.
    assert (await client.send(chat_id, "é" * 50)).status_code == 303
    await client.wait_idle(chat_id)
    # A body far beyond any message is refused before it is read.
    huge = await client.http.post(
        f"/chats/{chat_id}/messages",
        content=b"text=" + b"a" * 2_000_000,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert huge.status_code == 413
    assert len(await client.web.session.segments(chat_id)) == 1


async def test_default_limit_is_100_000_characters(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([]))
    chat_id = await client.new_chat()
    response = await client.send(chat_id, "x" * 100_001)
    assert response.status_code == 413
    assert "limit is 100,000" in parse_html(response.text).find(id="composer-alert").norm_text()


async def test_malformed_forms_are_400(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([]))
    chat_id = await client.new_chat()
    url = f"/chats/{chat_id}/messages"
    cases = [
        {"data": {"message": "no text field"}},
        {"data": {"text": "hi", "client_id": "bad id with spaces"}},
        {"content": b'{"text": "hi"}', "headers": {"content-type": "application/json"}},
        {
            "content": b"text=%ff%fe",
            "headers": {"content-type": "application/x-www-form-urlencoded"},
        },
    ]
    for case in cases:
        response = await client.http.post(url, **case)  # type: ignore[arg-type]
        assert response.status_code == 400, case
        assert parse_html(response.text).find(id="composer-alert").norm_text()
    assert await client.web.session.segments(chat_id) == []


async def test_multipart_form_is_accepted(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["fine"]))
    chat_id = await client.new_chat()
    response = await client.http.post(f"/chats/{chat_id}/messages", files={"text": (None, "hello")})
    assert response.status_code == 303
    await client.wait_idle(chat_id)
    assert len(await client.web.session.segments(chat_id)) == 1


async def test_tool_calls_render_as_cards(web_client_factory: MakeClient):
    model = ScriptedModel(
        [
            [("calculator", {"expression": "12*(3+4)"}), ("calculator", {"expression": "1/0"})],
            "It is **84**.",
        ]
    )
    client = await web_client_factory(model=model)
    chat_id = await client.new_chat()
    await client.send(chat_id, "what is 12*(3+4)?")
    await client.wait_idle(chat_id)
    entries = (await client.web.session.segments(chat_id))[0].entries
    assert [type(e) for e in entries] == [
        UserEntry,
        ToolCallEntry,
        ToolCallEntry,
        ToolResultEntry,
        ToolResultEntry,
        AssistantEntry,
    ]
    reply = replies(await client.page(chat_id))[0]
    cards = reply.find_all(data_role="tool")
    assert len(cards) == 2
    ok, failed = cards
    assert ok.find(class_="tool-name").text() == "calculator"
    assert '"expression": "12*(3+4)"' in ok.find(class_="tool-args").text()
    assert ok.find(class_="tool-result").text() == "84"
    assert "data-error" not in ok.attrs
    assert failed.attrs["data-error"] == "true"
    assert failed.find(class_="tool-result").text()  # the error text is shown
    assert reply_text(reply) == "It is 84."


async def test_reasoning_is_collapsed(web_client_factory: MakeClient):
    from webapp.runtime.model import FinishPart, ReasoningPart, TextPart

    class Thinker:
        async def stream(self, request):  # type: ignore[no-untyped-def]
            yield ReasoningPart("Let me think.")
            yield TextPart("Answer.")
            yield FinishPart("stop")

    client = await web_client_factory(model=Thinker())
    chat_id = await client.new_chat()
    await client.send(chat_id, "think")
    await client.wait_idle(chat_id)
    reply = replies(await client.page(chat_id))[0]
    details = reply.find("details", class_="reasoning")
    assert "open" not in details.attrs
    assert details.find("summary").norm_text() == "Reasoning"
    assert details.find(class_="reasoning-text").text() == "Let me think."
    assert reply_text(reply) == "Answer."


async def test_failed_run_shows_the_error_and_keeps_the_message(web_client_factory: MakeClient):
    secret = "sk-test-SECRET-123456"
    error = ModelError(f"endpoint http://127.0.0.1:9/v1 answered 500: on fire (key {secret})")
    client = await web_client_factory(model=ScriptedModel([error]), redact=[secret])
    chat_id = await client.new_chat()
    await client.send(chat_id, "please answer")
    await client.wait_idle(chat_id)
    segments = await client.web.session.segments(chat_id)
    assert len(segments) == 1
    assert segments[0].entries == [UserEntry("please answer")]
    assert segments[0].meta is not None and segments[0].meta["status"] == "failed"
    assert await client.web.checkpointer.load(segments[0].run_id) is None
    page = await client.page(chat_id)
    user, reply = messages(page)
    assert user.find(class_="content").text() == "please answer"
    assert reply.attrs["data-status"] == "failed"
    alert = reply.find(role="alert").norm_text()
    assert "answered 500: on fire" in alert
    assert secret not in (await client.http.get(f"/chats/{chat_id}")).text
    # The chat is usable again: Regenerate is offered and a new message works.
    assert len(buttons(page, "Regenerate")) == 1
    assert form_of(buttons(page, "Send")[0]).attrs["action"] == f"/chats/{chat_id}/messages"
