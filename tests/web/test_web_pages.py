"""Pages and chat management: home, new chat, chat page, rename, delete, 404s, static files."""

from __future__ import annotations

import pytest
from webhelpers import (
    HX,
    MakeClient,
    buttons,
    form_of,
    messages,
    parse_html,
    replies,
    reply_text,
)

from webapp.chats.users import EVERY_CHAT
from webapp.models import ScriptedModel

ON_BOTH_DATABASES = True  # every test here that builds the app runs on SQLite and PostgreSQL


async def test_empty_home_has_the_composer_and_the_chat_list(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([]))
    response = await client.http.get("/")
    assert response.status_code == 200
    page = parse_html(response.text)
    nav = page.find("nav", aria_label="Chats")
    assert nav.norm_text() == "No chats yet"
    label = [lab for lab in page.find_all("label") if lab.norm_text() == "Message"]
    assert len(label) == 1
    area = page.find("textarea", id=label[0].attrs["for"] or "")
    assert area.attrs["name"] == "text"
    # Nothing else is labelled like it (a "Messages" region made get_by_label ambiguous).
    labelled = [n.attrs["aria-label"] for n in page.iter() if n.attrs.get("aria-label")]
    assert not [name for name in labelled if "message" in (name or "").lower()]
    composer = form_of(buttons(page, "Send")[0])
    # Without a chat, the first message creates one.
    assert composer.attrs["action"] == "/chats"
    assert composer.attrs["method"] == "post"
    assert len(buttons(page, "New chat")) == 1
    assert buttons(page, "Stop") == [] and buttons(page, "Regenerate") == []


async def test_first_message_from_home_creates_a_chat_and_runs(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["Hello there friend"]))
    response = await client.http.post("/chats", data={"text": "hi", "client_id": "c1"})
    assert response.status_code == 303
    chat_id = response.headers["location"].rsplit("/", 1)[1]
    await client.wait_idle(chat_id)
    segments = await client.web.session.segments(chat_id)
    assert len(segments) == 1
    page = await client.page(chat_id)
    assert [m.attrs["data-role"] for m in messages(page)] == ["user", "assistant"]
    assert reply_text(replies(page)[0]) == "Hello there friend"
    # The title comes from the first message.
    assert page.find("h1").norm_text() == "hi"


async def test_home_is_an_empty_new_chat_even_when_chats_exist(web_client_factory: MakeClient):
    # Regression: / redirected to the newest chat, so a new user's first message
    # landed in yesterday's conversation.
    client = await web_client_factory(model=ScriptedModel(["Old reply", "New reply"]))
    old = await client.new_chat()
    await client.send(old, "yesterday's question")
    await client.wait_idle(old)
    response = await client.http.get("/")
    assert response.status_code == 200
    page = parse_html(response.text)
    assert messages(page) == []
    assert page.find("form", id="composer").attrs["action"] == "/chats"
    links = page.find("nav", aria_label="Chats").find_all("a")
    assert [a.attrs["href"] for a in links] == [f"/chats/{old}"]  # one click away
    assert all("aria-current" not in a.attrs for a in links)
    created = await client.http.post("/chats", data={"text": "a new question", "client_id": "n1"})
    new = created.headers["location"].rsplit("/", 1)[1]
    assert new != old
    await client.wait_idle(new)
    assert len(await client.web.session.segments(old)) == 1  # the old chat is untouched


async def test_new_chat_redirects_and_lists_it(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([]))
    chat_id = await client.new_chat()
    page = await client.page(chat_id)
    links = page.find("nav", aria_label="Chats").find_all("a")
    assert [a.attrs["href"] for a in links] == [f"/chats/{chat_id}"]
    assert links[0].attrs["aria-current"] == "page"
    assert links[0].norm_text() == "New chat"
    # htmx asks for a full navigation instead of a fragment.
    response = await client.http.post("/chats", headers=HX)
    assert response.status_code == 204
    assert response.headers["HX-Redirect"].startswith("/chats/")


async def test_unknown_chat_is_a_404_page(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([]))
    for path in ("/chats/nope", "/chats/0123456789abcdef0123456789abcdef/delete", "/no/such/page"):
        response = await client.http.get(path)
        assert response.status_code == 404, path
        page = parse_html(response.text)
        assert "404" in page.find("h1").norm_text()
        assert page.find(role="alert").norm_text()
    for path in (
        "/chats/nope/messages",
        "/chats/nope/regenerate",
        "/chats/nope/rename",
        "/chats/nope/delete",
        "/chats/nope/runs/r1/stop",
        "/chats/nope/messages/r1/edit",
    ):
        response = await client.http.post(path, data={"text": "x", "title": "t"})
        assert response.status_code == 404, path
    # htmx gets the same refusal as an alert fragment aimed at the composer's alert.
    response = await client.http.post("/chats/nope/messages", data={"text": "x"}, headers=HX)
    assert response.status_code == 404
    assert response.headers["HX-Retarget"] == "#composer-alert"
    assert "does not exist" in parse_html(response.text).find(role="alert").norm_text()
    # A send is refused by its own record, which writes nothing of it.
    response = await client.http.post("/chats/nope/messages", data={"text": "x", "client_id": "c1"})
    assert response.status_code == 404
    assert await client.web.store.find_send(EVERY_CHAT, "c1") is None


async def test_unknown_message_and_run_ids_are_404(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["ok"]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "hello")
    await client.wait_idle(chat_id)
    assert (await client.http.get(f"/chats/{chat_id}/messages/unknown/edit")).status_code == 404
    response = await client.http.post(f"/chats/{chat_id}/messages/unknown/edit", data={"text": "x"})
    assert response.status_code == 404
    assert (await client.http.get(f"/chats/{chat_id}/runs/unknown/events")).status_code == 404
    assert (await client.http.post(f"/chats/{chat_id}/runs/unknown/stop")).status_code == 404
    # Nothing was rewound by the stale edit.
    assert len(await client.web.session.segments(chat_id)) == 1


async def test_wrong_method_is_refused(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([]))
    response = await client.http.get("/chats")
    assert response.status_code == 405


async def test_rename_sets_the_title_and_empty_restores_the_automatic_one(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(model=ScriptedModel(["a reply"]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "What is   a good\nname for a cat?")
    await client.wait_idle(chat_id)
    response = await client.http.post(f"/chats/{chat_id}/rename", data={"title": "  Cats  "})
    assert response.status_code == 303
    chat = await client.web.chats.get(EVERY_CHAT, chat_id)
    assert chat is not None and chat.title == "Cats"
    page = await client.page(chat_id)
    assert page.find("h1").norm_text() == "Cats"
    assert page.find("nav", aria_label="Chats").find("a").norm_text() == "Cats"
    await client.http.post(f"/chats/{chat_id}/rename", data={"title": ""})
    chat = await client.web.chats.get(EVERY_CHAT, chat_id)
    assert chat is not None and chat.title == "What is a good name for a cat?"
    too_long = await client.http.post(f"/chats/{chat_id}/rename", data={"title": "x" * 201})
    assert too_long.status_code == 400
    missing = await client.http.post(f"/chats/{chat_id}/rename", data={"name": "x"})
    assert missing.status_code == 400


async def test_delete_needs_a_confirm_step_and_removes_everything(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["a reply"]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "hello")
    await client.wait_idle(chat_id)
    page = await client.page(chat_id)
    # Without JavaScript the Delete button leads to a confirmation page (a GET)...
    delete_form = form_of(buttons(page, "Delete chat")[0])
    assert delete_form.attrs["method"] == "get"
    assert delete_form.attrs["hx-confirm"]
    confirm = await client.http.get(delete_form.attrs["action"] or "")
    assert confirm.status_code == 200
    confirm_page = parse_html(confirm.text)
    post_form = form_of(buttons(confirm_page, "Delete chat")[0])
    assert post_form.attrs["method"] == "post"
    assert await client.web.chats.get(EVERY_CHAT, chat_id) is not None  # looking changed nothing
    # ... whose POST deletes.
    response = await client.http.post(post_form.attrs["action"] or "")
    assert response.status_code == 303
    assert response.headers["location"] == "/"
    assert await client.web.chats.get(EVERY_CHAT, chat_id) is None
    assert await client.web.session.segments(chat_id) == []
    assert (await client.http.get(f"/chats/{chat_id}")).status_code == 404


async def test_static_files_and_vendored_versions(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([]))
    page = parse_html((await client.http.get("/")).text)
    scripts = [s.attrs["src"] for s in page.find_all("script")]
    assert scripts == ["/static/htmx.min.js", "/static/htmx-ext-sse.js", "/static/app.js"]
    for src in scripts:
        response = await client.http.get(src or "")
        assert response.status_code == 200
        assert "javascript" in response.headers["content-type"]
    for sheet in page.find_all("link", rel="stylesheet"):
        response = await client.http.get(sheet.attrs["href"] or "")
        assert response.status_code == 200
        assert "text/css" in response.headers["content-type"]
    htmx = (await client.http.get("/static/htmx.min.js")).text
    assert 'version:"2.0.11"' in htmx.replace(" ", "")
    notes = (await client.http.get("/static/VENDORED.md")).text
    assert "htmx.org | 2.0.11" in notes and "htmx-ext-sse | 2.2.4" in notes


def test_missing_templates_or_static_files_fail_at_build_time(tmp_path):  # type: ignore[no-untyped-def]

    from webapp.web import create_app

    for kwargs in ({"templates_dir": tmp_path}, {"static_dir": tmp_path}):
        with pytest.raises(FileNotFoundError, match="pip install -e"):
            create_app(tmp_path / "chat.db", **kwargs)


async def test_shutdown_releases_the_endpoint_models_pooled_connections(tmp_path):
    from webapp.models import OpenAIChatModel
    from webapp.web import create_app

    model = OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1")
    app = create_app(tmp_path / "chat.db", model=model)
    async with app.router.lifespan_context(app):
        client = model._http()  # the pool a first request would open
    assert client.is_closed
    assert model._client is None
