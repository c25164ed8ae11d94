"""Flows 3 and 4: edit and resend, regenerate -- rewind, delete leftover checkpoints, run."""

from __future__ import annotations

from webhelpers import (
    HX,
    MakeClient,
    WebClient,
    buttons,
    form_of,
    messages,
    parse_html,
    replies,
    reply_text,
    textarea_value,
)

from webapp.chats.users import EVERY_CHAT
from webapp.models import ScriptedModel
from webapp.stores.checkpoint import RunHead
from webapp.transcript import AssistantEntry, UserEntry

ON_BOTH_DATABASES = True  # every test here that builds the app runs on SQLite and PostgreSQL


async def three_exchanges(client: WebClient) -> str:
    chat_id = await client.new_chat()
    for text in ("one", "two", "three"):
        await client.send(chat_id, text)
        await client.wait_idle(chat_id)
    return chat_id


async def test_edit_rewinds_to_before_the_message_and_runs_the_new_text(
    web_client_factory: MakeClient,
):
    model = ScriptedModel(["r1", "r2", "r3", "r2-edited"])
    client = await web_client_factory(model=model)
    chat_id = await three_exchanges(client)
    before = await client.web.session.segments(chat_id)
    second, third = before[1].run_id, before[2].run_id
    # A checkpoint left behind for an undone run must go too (or a resume writes it back).
    await client.web.checkpointer.append(third, [UserEntry("three")], RunHead("assistant"))
    page = await client.page(chat_id)
    edit_button = buttons(page.find(id=f"msg-{second}"), "Edit")[0]
    edit_url = form_of(edit_button).attrs["action"]
    assert edit_url == f"/chats/{chat_id}/messages/{second}/edit"
    response = await client.http.post(edit_url or "", data={"text": "two, edited"})
    assert response.status_code == 303
    await client.wait_idle(chat_id)
    after = await client.web.session.segments(chat_id)
    assert [s.entries for s in after] == [
        [UserEntry("one"), AssistantEntry("r1")],
        [UserEntry("two, edited"), AssistantEntry("r2-edited")],
    ]
    assert after[0].run_id == before[0].run_id
    assert after[1].run_id not in (second, third)
    assert await client.web.checkpointer.load(third) is None
    # The model saw the history before the edited message only.
    assert model.requests[-1] == [
        UserEntry("one"),
        AssistantEntry("r1"),
        UserEntry("two, edited"),
    ]
    page = await client.page(chat_id)
    assert [m.attrs["data-role"] for m in messages(page)] == ["user", "assistant"] * 2
    assert reply_text(replies(page)[1]) == "r2-edited"


async def test_edit_form_page_and_fragment(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["r1"]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "first <message>")
    await client.wait_idle(chat_id)
    run_id = (await client.web.session.segments(chat_id))[0].run_id
    url = f"/chats/{chat_id}/messages/{run_id}/edit"
    # Without JavaScript: the chat page with that message turned into the edit box.
    page = parse_html((await client.http.get(url)).text)
    assert textarea_value(page, "Edit message") == "first <message>"
    assert len(buttons(page, "Save and send")) == 1 and len(buttons(page, "Cancel")) == 1
    assert textarea_value(page, "Message") == ""
    assert len(page.find_all(data_role="user")) == 1
    # With htmx: the edit box alone, swapped over the message.
    fragment = parse_html((await client.http.get(url, headers=HX)).text)
    editor = fragment.find(data_role="user")
    assert editor.attrs["id"] == f"msg-{run_id}"
    assert textarea_value(fragment, "Edit message") == "first <message>"
    save = form_of(buttons(fragment, "Save and send")[0])
    assert save.attrs["hx-post"] == url and save.attrs["method"] == "post"
    cancel = buttons(fragment, "Cancel")[0]
    assert cancel.attrs["hx-select"] == f"#msg-{run_id}"
    # Cancel fetches the chat page, which holds the untouched message under that id.
    restored = parse_html((await client.http.get(cancel.attrs["hx-get"] or "")).text)
    assert restored.find(id=f"msg-{run_id}").find(class_="content").text() == "first <message>"


async def test_edit_while_running_is_409_and_changes_nothing(web_client_factory: MakeClient):
    client = await web_client_factory(
        model=ScriptedModel(["r1", "a b c d e f g h i j k l"], chunk_delay=0.05)
    )
    chat_id = await client.new_chat()
    await client.send(chat_id, "one")
    await client.wait_idle(chat_id)
    first = (await client.web.session.segments(chat_id))[0].run_id
    await client.send(chat_id, "two")
    await client.wait_text(chat_id, 2)
    response = await client.http.post(
        f"/chats/{chat_id}/messages/{first}/edit", data={"text": "one, edited"}
    )
    assert response.status_code == 409
    page = parse_html(response.text)
    assert "still running" in page.find(id="composer-alert").norm_text()
    assert textarea_value(page, "Edit message") == "one, edited"  # the edit is not lost
    hx = await client.http.post(
        f"/chats/{chat_id}/messages/{first}/edit", data={"text": "x"}, headers=HX
    )
    assert hx.status_code == 409
    regen = await client.http.post(f"/chats/{chat_id}/regenerate")
    assert regen.status_code == 409
    await client.wait_idle(chat_id)
    segments = await client.web.session.segments(chat_id)
    assert [s.entries[0] for s in segments] == [UserEntry("one"), UserEntry("two")]


async def test_edit_validates_the_text(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["r1"]), max_message_chars=10)
    chat_id = await client.new_chat()
    await client.send(chat_id, "one")
    await client.wait_idle(chat_id)
    run_id = (await client.web.session.segments(chat_id))[0].run_id
    url = f"/chats/{chat_id}/messages/{run_id}/edit"
    assert (await client.http.post(url, data={"text": " "})).status_code == 400
    too_long = await client.http.post(url, data={"text": "x" * 11})
    assert too_long.status_code == 413
    assert textarea_value(parse_html(too_long.text), "Edit message") == "x" * 11
    assert (await client.http.post(url, data={})).status_code == 400
    assert len(await client.web.session.segments(chat_id)) == 1


async def test_regenerate_runs_the_last_message_again(web_client_factory: MakeClient):
    model = ScriptedModel(["r1", "r2", "r3", "r3 again"])
    client = await web_client_factory(model=model)
    chat_id = await three_exchanges(client)
    before = await client.web.session.segments(chat_id)
    page = await client.page(chat_id)
    # Every reply offers Regenerate inside its own element (SPEC §7); the last one here.
    assert [len(buttons(r, "Regenerate")) for r in replies(page)] == [1, 1, 1]
    form = form_of(buttons(replies(page)[-1], "Regenerate")[0])
    fields = {i.attrs["name"]: i.attrs["value"] for i in form.find_all("input")}
    response = await client.http.post(form.attrs["action"] or "", data=fields)
    assert response.status_code == 303
    await client.wait_idle(chat_id)
    after = await client.web.session.segments(chat_id)
    assert [s.run_id for s in after[:2]] == [s.run_id for s in before[:2]]
    assert after[2].run_id != before[2].run_id
    assert after[2].entries == [UserEntry("three"), AssistantEntry("r3 again")]
    assert len(after) == 3
    page = await client.page(chat_id)
    last = replies(page)[-1]
    assert last.attrs["data-run-id"] == after[2].run_id
    assert reply_text(last) == "r3 again"
    assert len(page.find_all(data_role="user")) == 3


async def test_htmx_regenerate_returns_the_new_list(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["r1", "r1 b c d"], chunk_delay=0.02))
    chat_id = await client.new_chat()
    await client.send(chat_id, "one")
    await client.wait_idle(chat_id)
    old = (await client.web.session.segments(chat_id))[0].run_id
    response = await client.http.post(f"/chats/{chat_id}/regenerate", headers=HX)
    assert response.status_code == 200
    fragment = parse_html(response.text)
    reply = fragment.find(data_role="assistant")
    assert reply.attrs["data-run-id"] != old
    assert reply.attrs["data-status"] == "streaming"
    assert len(fragment.find_all(data_role="user")) == 1
    await client.wait_idle(chat_id)


async def test_regenerate_after_a_stop_and_with_nothing_to_regenerate(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(
        model=ScriptedModel([" ".join("abcdefghijklmnopqrstuvwxyz"), "fresh"], chunk_delay=0.02)
    )
    chat_id = await client.new_chat()
    nothing = await client.http.post(f"/chats/{chat_id}/regenerate")
    assert nothing.status_code == 400
    assert "no reply" in parse_html(nothing.text).find(id="composer-alert").norm_text()
    await client.send(chat_id, "letters")
    await client.wait_text(chat_id, 4)
    run_id = await client.active_run(chat_id)
    await client.http.post(f"/chats/{chat_id}/runs/{run_id}/stop")
    assert (await client.http.post(f"/chats/{chat_id}/regenerate")).status_code == 303
    await client.wait_idle(chat_id)
    segments = await client.web.session.segments(chat_id)
    assert len(segments) == 1
    assert segments[0].entries == [UserEntry("letters"), AssistantEntry("fresh")]
    assert segments[0].meta is None


async def test_editing_the_first_message_renames_an_automatic_title(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["r1", "r1 again", "r1 third"]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "frist message")
    await client.wait_idle(chat_id)
    run_id = (await client.web.session.segments(chat_id))[0].run_id
    await client.http.post(f"/chats/{chat_id}/messages/{run_id}/edit", data={"text": "first"})
    await client.wait_idle(chat_id)
    chat = await client.web.chats.get(EVERY_CHAT, chat_id)
    assert chat is not None and chat.title == "first"
    # A title the user chose is left alone.
    await client.http.post(f"/chats/{chat_id}/rename", data={"title": "Mine"})
    run_id = (await client.web.session.segments(chat_id))[0].run_id
    await client.http.post(f"/chats/{chat_id}/messages/{run_id}/edit", data={"text": "again"})
    await client.wait_idle(chat_id)
    chat = await client.web.chats.get(EVERY_CHAT, chat_id)
    assert chat is not None and chat.title == "Mine"


async def test_regenerate_and_edit_of_a_version_not_shown_are_both_404(
    web_client_factory: MakeClient,
):
    # Regenerate answered 400 "There is no reply to regenerate yet" where edit said 404.
    client = await web_client_factory(model=ScriptedModel(["r1", "r1 again", "never"]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "one")
    await client.wait_idle(chat_id)
    hidden = (await client.web.session.segments(chat_id))[0].run_id
    await client.http.post(f"/chats/{chat_id}/regenerate", data={"run_id": hidden})
    await client.wait_idle(chat_id)
    shown = await client.web.session.segments(chat_id)
    assert hidden not in {s.run_id for s in shown}  # a version, not on the page
    regenerated = await client.http.post(f"/chats/{chat_id}/regenerate", data={"run_id": hidden})
    edited = await client.http.post(
        f"/chats/{chat_id}/messages/{hidden}/edit", data={"text": "changed"}
    )
    assert (regenerated.status_code, edited.status_code) == (404, 404)
    assert "not in this chat any more" in parse_html(regenerated.text).norm_text()
    assert await client.web.session.segments(chat_id) == shown
