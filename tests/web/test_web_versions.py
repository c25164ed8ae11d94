"""SPEC §7: versions of messages and replies, switching, branch and continue.

The chat is a tree; the session holds exactly the path on the page. Each test
checks what the page shows, what the session (the model's view) holds, and
what the model was sent.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from webhelpers import HX, MakeClient, Node, buttons, form_of, messages, parse_html, replies, serve

from webapp.chats.store import ChatStore
from webapp.chats.users import EVERY_CHAT
from webapp.models import OfflineModel, ScriptedModel
from webapp.models.openai_chat import OpenAIChatModel
from webapp.stores.sqlite_session import SQLiteSession
from webapp.transcript import AssistantEntry, Entry, UserEntry

ON_BOTH_DATABASES = True  # every test here that builds the app runs on SQLite and PostgreSQL


WORDS = " ".join(f"w{i}" for i in range(1, 200))


def switcher(item: Node) -> tuple[str, bool, bool] | None:
    """("N / M", previous enabled, next enabled) of a message's switcher, or None."""
    groups = item.find_all(role="group", aria_label="Versions")
    if not groups:
        return None
    group = groups[0]
    count = group.find(class_="version-count").norm_text()
    prev = group.find("button", aria_label="Previous version")
    nxt = group.find("button", aria_label="Next version")
    return count, "disabled" not in prev.attrs, "disabled" not in nxt.attrs


def target(item: Node, label: str) -> str:
    """The run id a switcher button shows."""
    button = item.find("button", aria_label=label)
    return form_of(button).find("input", name="run_id").attrs["value"] or ""


async def texts(client, chat_id: str) -> list[tuple[str, str]]:
    page = await client.page(chat_id)
    return [(m.attrs["data-role"], m.find(class_="content").norm_text()) for m in messages(page)]


async def exchange(client, chat_id: str, text: str) -> None:
    response = await client.send(chat_id, text)
    assert response.status_code == 303, response.text
    await client.wait_idle(chat_id)


def flat(entries: list[Entry]) -> list[str]:
    return [getattr(e, "text", "") for e in entries]


async def test_regenerate_keeps_the_old_reply_as_a_version(web_client_factory: MakeClient):
    model = ScriptedModel(["first answer", "second answer", "next"])
    client = await web_client_factory(model=model)
    chat_id = await client.new_chat()
    await exchange(client, chat_id, "question")
    old = (await client.web.session.segments(chat_id))[0].run_id
    await client.http.post(f"/chats/{chat_id}/regenerate", data={"run_id": old})
    await client.wait_idle(chat_id)
    page = await client.page(chat_id)
    reply = replies(page)[0]
    assert reply.find(class_="content").norm_text() == "second answer"
    assert switcher(reply) == ("2 / 2", True, False)
    assert switcher(page.find(data_role="user")) is None  # one version of the message
    # Previous version: the first answer is back, in the page and in the session.
    response = await client.http.post(
        f"/chats/{chat_id}/switch", data={"run_id": target(reply, "Previous version")}
    )
    assert response.status_code == 303
    page = await client.page(chat_id)
    reply = replies(page)[0]
    assert reply.find(class_="content").norm_text() == "first answer"
    assert reply.attrs["data-run-id"] == old
    assert switcher(reply) == ("1 / 2", False, True)
    segments = await client.web.session.segments(chat_id)
    assert [(s.run_id, s.entries) for s in segments] == [
        (old, [UserEntry("question"), AssistantEntry("first answer")])
    ]
    # The model sees only what is shown.
    await exchange(client, chat_id, "more")
    assert flat(model.requests[-1]) == ["question", "first answer", "more"]


async def test_editing_the_first_of_three_keeps_the_later_turns_in_the_old_version(
    web_client_factory: MakeClient,
):
    model = ScriptedModel(["r1", "r2", "r3", "edited reply", "after switching"])
    client = await web_client_factory(model=model)
    chat_id = await client.new_chat()
    for text in ("one", "two", "three"):
        await exchange(client, chat_id, text)
    first = (await client.web.session.segments(chat_id))[0].run_id
    response = await client.http.post(
        f"/chats/{chat_id}/messages/{first}/edit", data={"text": "uno"}
    )
    assert response.status_code == 303
    await client.wait_idle(chat_id)
    assert await texts(client, chat_id) == [("user", "uno"), ("assistant", "edited reply")]
    page = await client.page(chat_id)
    user = page.find(data_role="user")
    assert switcher(user) == ("2 / 2", True, False)
    await client.http.post(
        f"/chats/{chat_id}/switch", data={"run_id": target(user, "Previous version")}
    )
    assert await texts(client, chat_id) == [
        ("user", "one"), ("assistant", "r1"),
        ("user", "two"), ("assistant", "r2"),
        ("user", "three"), ("assistant", "r3"),
    ]  # fmt: skip
    assert (await client.web.session.segments(chat_id))[0].run_id == first
    await exchange(client, chat_id, "four")
    assert flat(model.requests[-1]) == ["one", "r1", "two", "r2", "three", "r3", "four"]
    # And forward again to the edit, which still has its reply.
    page = await client.page(chat_id)
    await client.http.post(
        f"/chats/{chat_id}/switch",
        data={"run_id": target(page.find_all(data_role="user")[0], "Next version")},
    )
    assert await texts(client, chat_id) == [("user", "uno"), ("assistant", "edited reply")]


async def test_nested_versions_keep_their_selection(web_client_factory: MakeClient):
    model = ScriptedModel(["a1", "b1", "b2", "a-edit"])
    client = await web_client_factory(model=model)
    chat_id = await client.new_chat()
    await exchange(client, chat_id, "A")
    await exchange(client, chat_id, "B")
    b_run = (await client.web.session.segments(chat_id))[1].run_id
    await client.http.post(f"/chats/{chat_id}/regenerate", data={"run_id": b_run})
    await client.wait_idle(chat_id)
    page = await client.page(chat_id)
    assert switcher(replies(page)[1]) == ("2 / 2", True, False)  # b2 shown
    a_run = (await client.web.session.segments(chat_id))[0].run_id
    await client.http.post(f"/chats/{chat_id}/messages/{a_run}/edit", data={"text": "A2"})
    await client.wait_idle(chat_id)
    page = await client.page(chat_id)
    await client.http.post(
        f"/chats/{chat_id}/switch",
        data={"run_id": target(page.find(data_role="user"), "Previous version")},
    )
    # Back on the first version of A: B's reply is still the one chosen there (b2).
    assert await texts(client, chat_id) == [
        ("user", "A"), ("assistant", "a1"), ("user", "B"), ("assistant", "b2"),
    ]  # fmt: skip
    page = await client.page(chat_id)
    assert switcher(replies(page)[1]) == ("2 / 2", True, False)


async def test_a_stopped_reply_is_a_version_and_switching_during_a_run_is_busy(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(model=ScriptedModel([WORDS, WORDS], chunk_delay=0.02))
    chat_id = await client.new_chat()
    await client.send(chat_id, "talk")
    await client.wait_text(chat_id, 8)
    first = await client.active_run(chat_id)
    await client.http.post(f"/chats/{chat_id}/runs/{first}/stop")
    await client.http.post(f"/chats/{chat_id}/regenerate", data={"run_id": first})
    await client.wait_text(chat_id, 8)
    response = await client.http.post(
        f"/chats/{chat_id}/switch", data={"run_id": first}, headers=HX
    )
    assert response.status_code == 409
    assert "still running" in parse_html(response.text).find(id="composer-alert").norm_text()
    second = await client.active_run(chat_id)
    await client.http.post(f"/chats/{chat_id}/runs/{second}/stop")
    await client.http.post(f"/chats/{chat_id}/switch", data={"run_id": first})
    page = await client.page(chat_id)
    reply = replies(page)[0]
    assert reply.attrs["data-run-id"] == first
    assert reply.attrs["data-status"] == "stopped"
    assert switcher(reply) == ("1 / 2", False, True)
    # An unknown or malformed version is refused without a change.
    assert (
        await client.http.post(f"/chats/{chat_id}/switch", data={"run_id": "f" * 32})
    ).status_code == 404
    assert (
        await client.http.post(f"/chats/{chat_id}/switch", data={"run_id": "<x>"})
    ).status_code == 400
    assert (await client.web.session.segments(chat_id))[0].run_id == first


async def test_selection_survives_a_restart_and_delete_removes_every_version(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    client = await web_client_factory(db=db, model=ScriptedModel(["one", "two"]))
    chat_id = await client.new_chat()
    await exchange(client, chat_id, "q")
    old = (await client.web.session.segments(chat_id))[0].run_id
    await client.http.post(f"/chats/{chat_id}/regenerate")
    await client.wait_idle(chat_id)
    await client.http.post(f"/chats/{chat_id}/switch", data={"run_id": old})
    again = await web_client_factory(db=db, model=ScriptedModel([]))
    page = await again.page(chat_id)
    assert replies(page)[0].attrs["data-run-id"] == old
    assert switcher(replies(page)[0]) == ("1 / 2", False, True)
    await again.http.post(f"/chats/{chat_id}/delete")
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM chat_runs").fetchone()[0] == 0
        assert conn.execute("SELECT COUNT(*) FROM session_segments").fetchone()[0] == 0


async def test_branch_copies_the_shown_path_into_a_new_chat(web_client_factory: MakeClient):
    model = ScriptedModel(["r1", "r2", "r3", "in the branch"])
    client = await web_client_factory(model=model)
    chat_id = await client.new_chat()
    for text in ("one", "two", "three"):
        await exchange(client, chat_id, text)
    before = await client.web.session.segments(chat_id)
    page = await client.page(chat_id)
    form = form_of(buttons(replies(page)[1], "Branch")[0])
    response = await client.http.post(form.attrs["action"] or "")
    assert response.status_code == 303
    branch_id = response.headers["location"].rsplit("/", 1)[1]
    assert branch_id != chat_id
    branch = await client.web.chats.get(EVERY_CHAT, branch_id)
    assert branch is not None and branch.title == "one (branch)"
    assert await texts(client, branch_id) == [
        ("user", "one"), ("assistant", "r1"), ("user", "two"), ("assistant", "r2"),
    ]  # fmt: skip
    copied = await client.web.session.segments(branch_id)
    assert [s.entries for s in copied] == [s.entries for s in before[:2]]
    assert not {s.run_id for s in copied} & {s.run_id for s in before}  # its own runs
    assert await client.web.session.segments(chat_id) == before  # the original is unchanged
    await exchange(client, branch_id, "go on")
    assert flat(model.requests[-1]) == ["one", "r1", "two", "r2", "go on"]
    # htmx opens the new chat at once.
    response = await client.http.post(form.attrs["action"] or "", headers=HX)
    assert response.status_code == 204 and response.headers["HX-Redirect"].startswith("/chats/")


async def test_continue_a_stopped_count_gives_one_gapless_reply(web_client_factory: MakeClient):
    client = await web_client_factory(model=OfflineModel(delay=0.01))
    chat_id = await client.new_chat()
    await client.send(chat_id, "count to 60")
    await client.wait_text(chat_id, 20)
    run_id = await client.active_run(chat_id)
    await client.http.post(f"/chats/{chat_id}/runs/{run_id}/stop")
    page = await client.page(chat_id)
    reply = replies(page)[0]
    assert reply.attrs["data-status"] == "stopped"
    response = await client.http.post(
        form_of(buttons(reply, "Continue")[0]).attrs["action"] or "", headers=HX
    )
    assert response.status_code == 200
    live = parse_html(response.text).find(data_role="assistant")
    assert live.attrs["data-run-id"] == run_id  # the same reply element goes on
    assert live.attrs["data-status"] == "streaming"
    await client.wait_idle(chat_id)
    expected = " ".join(str(n) for n in range(1, 61))
    page = await client.page(chat_id)
    assert [r.attrs["data-run-id"] for r in replies(page)] == [run_id]
    assert replies(page)[0].find(class_="content").norm_text() == expected
    assert buttons(replies(page)[0], "Continue") == []  # complete now
    segments = await client.web.session.segments(chat_id)
    assert [(s.run_id, s.entries) for s in segments] == [
        (run_id, [UserEntry("count to 60"), AssistantEntry(expected)])
    ]
    # Continue is refused where it does not apply.
    refused = await client.http.post(f"/chats/{chat_id}/runs/{run_id}/continue")
    assert refused.status_code == 400


async def test_continue_is_offered_only_on_the_last_reply(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([WORDS, "later"], chunk_delay=0.02))
    chat_id = await client.new_chat()
    await client.send(chat_id, "talk")
    await client.wait_text(chat_id, 8)
    run_id = await client.active_run(chat_id)
    await client.http.post(f"/chats/{chat_id}/runs/{run_id}/stop")
    assert len(buttons(replies(await client.page(chat_id))[0], "Continue")) == 1
    await exchange(client, chat_id, "next")
    stopped, last = replies(await client.page(chat_id))
    assert stopped.attrs["data-status"] == "stopped"
    assert buttons(stopped, "Continue") == [] and buttons(last, "Continue") == []


async def test_chats_stored_before_versions_get_a_tree(
    web_client_factory: MakeClient, tmp_path: Path
):
    # A database written before versions: chats and segments, no tree rows.
    db = tmp_path / "chat.db"
    store = ChatStore(db)
    chat = await store.create(EVERY_CHAT, "old chat")
    await store.close()
    async with SQLiteSession(db, wal=True) as session:
        await session.append(
            chat.id, [UserEntry("hi"), AssistantEntry("old reply")], run_id="r-old"
        )
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM chat_runs")
    client = await web_client_factory(db=db, model=ScriptedModel(["new reply"]))
    await client.http.post(f"/chats/{chat.id}/regenerate", data={"run_id": "r-old"})
    await client.wait_idle(chat.id)
    page = await client.page(chat.id)
    assert switcher(replies(page)[0]) == ("2 / 2", True, False)
    await client.http.post(f"/chats/{chat.id}/switch", data={"run_id": "r-old"})
    assert await texts(client, chat.id) == [("user", "hi"), ("assistant", "old reply")]


async def test_branch_titles_stay_within_the_title_limit(web_client_factory: MakeClient):
    # A 200-character title gave a 209-character branch, then 218: over the limit, so
    # the branch could be neither renamed to its own title nor exported and imported back.
    client = await web_client_factory(model=ScriptedModel(["r1"]))
    chat_id = await client.new_chat()
    await exchange(client, chat_id, "one")
    long = "word " * 39 + "last!"  # 200 characters
    response = await client.http.post(f"/chats/{chat_id}/rename", data={"title": long})
    assert response.status_code == 303
    titles = []
    for _ in range(2):
        run_id = (await client.web.session.segments(chat_id))[0].run_id
        response = await client.http.post(f"/chats/{chat_id}/runs/{run_id}/branch")
        assert response.status_code == 303
        chat_id = response.headers["location"].rsplit("/", 1)[1]
        chat = await client.web.chats.get(EVERY_CHAT, chat_id)
        assert chat is not None
        titles.append(chat.title)
    assert all(190 < len(t) <= 200 for t in titles)
    assert titles[0] == long[:190].rstrip() + "… (branch)"
    assert titles[1] == titles[0][:190].rstrip() + "… (branch)"
    response = await client.http.post(f"/chats/{chat_id}/rename", data={"title": titles[1]})
    assert response.status_code == 303
    exported = await client.http.get(f"/chats/{chat_id}/export.json")
    imported = await client.http.post(
        "/chats/import", files={"file": ("c.json", exported.content, "application/json")}
    )
    assert imported.status_code == 303


async def test_a_reply_whose_stream_was_cut_can_be_continued(web_client_factory: MakeClient):
    # The endpoint's stream ends mid-reply (no finish_reason, no [DONE]): the reply keeps
    # its text and says why it failed, and offers Continue as a stopped reply does.
    requests: list[dict[str, Any]] = []

    async def completions(request: Request) -> StreamingResponse:
        requests.append(await request.json())
        cut = len(requests) == 1
        texts = ["Partial answer,", " cut"] if cut else [" and the rest."]
        return StreamingResponse(chunks(texts, finished=not cut), media_type="text/event-stream")

    endpoint = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    async with serve(endpoint) as base:
        model = OpenAIChatModel("m", base_url=base + "/v1", max_retries=0)
        client = await web_client_factory(model=model)
        chat_id = await client.new_chat()
        await exchange(client, chat_id, "tell me")
        reply = replies(await client.page(chat_id))[0]
        assert reply.attrs["data-status"] == "failed"
        assert "no finish_reason" in reply.find(class_="reply-error").norm_text()
        assert reply.find(class_="content").norm_text() == "Partial answer, cut"
        [button] = buttons(reply, "Continue")
        response = await client.http.post(form_of(button).attrs["action"] or "")
        assert response.status_code == 303
        await client.wait_idle(chat_id)
    reply = replies(await client.page(chat_id))[0]
    assert reply.attrs["data-status"] == "completed"
    assert reply.find(class_="content").norm_text() == "Partial answer, cut and the rest."
    assert buttons(reply, "Continue") == []
    [segment] = await client.web.session.segments(chat_id)
    assert segment.entries == [
        UserEntry("tell me"),
        AssistantEntry("Partial answer, cut and the rest."),
    ]
    assert len(requests) == 2


async def chunks(texts: list[str], *, finished: bool) -> AsyncIterator[bytes]:
    """Chat Completions SSE for ``texts``; unfinished, it just ends (a dropped stream)."""
    for text in texts:
        delta = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
        yield f"data: {json.dumps(delta)}\n\n".encode()
    if finished:
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        yield f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode()
