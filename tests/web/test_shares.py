"""SPEC §15 share links through the routes: a snapshot behind a random token, read-only,
revoked at once (by Revoke, a chat's delete, its owner's disable), on SQLite and PostgreSQL."""

from __future__ import annotations

import re

from people import HTML, add_user, new_chat, person, rows
from webhelpers import MakeClient, Node, WebClient, parse_html

from webapp.web.auth import AuthSettings

ON_BOTH_DATABASES = True


async def _share(client: WebClient, http: object, chat_id: str) -> str:
    made = await http.post(f"/chats/{chat_id}/share")  # type: ignore[attr-defined]
    assert made.status_code == 303, made.text
    page = parse_html((await http.get(f"/chats/{chat_id}/share", headers=HTML)).text)  # type: ignore[attr-defined]
    box = page.find("input", id="share-link")
    assert "readonly" in box.attrs
    found = re.search(r"/s/([A-Za-z0-9_-]+)$", box.attrs["value"] or "")
    assert found, box.attrs
    return found.group(1)


def _buttons(page: Node) -> list[str]:
    return [b.norm_text() for b in page.find_all("button") if b.norm_text() != "Copy"]


async def test_a_link_is_a_snapshot_until_updated_and_has_no_controls(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(offline_delay=0)
    chat_id = await client.new_chat()
    await client.send(chat_id, "first *words*")
    await client.wait_idle(chat_id)
    home = parse_html((await client.http.get(f"/chats/{chat_id}", headers=HTML)).text)
    assert home.find("a", href=f"/chats/{chat_id}/share").norm_text() == "Share"
    assert "Shared" not in home.find("nav", aria_label="Chats").norm_text()

    token = await _share(client, client.http, chat_id)
    assert len(token) >= 22  # 128 bits in URL-safe base64 at least
    await client.send(chat_id, "second message")
    await client.wait_idle(chat_id)

    shared = await client.http.get(f"/s/{token}", headers=HTML)
    assert shared.status_code == 200
    assert shared.headers["x-robots-tag"] == "noindex"
    assert shared.headers["referrer-policy"] == "no-referrer"
    page = parse_html(shared.text)
    robots = page.find("meta", name="robots")
    assert robots.attrs["content"] == "noindex, nofollow"
    roles = [m.attrs["data-role"] for m in page.find_all("article")]
    assert roles == ["user", "assistant"]
    assert "first" in page.norm_text() and "second message" not in page.norm_text()
    assert page.find("em").norm_text() == "words"  # Markdown rendered
    assert page.find_all("form") == [] and page.find_all("textarea") == []
    for word in ("Edit", "Regenerate", "Continue", "Stop", "Branch", "Send", "Delete"):
        assert not [b for b in page.find_all("button") if b.norm_text() == word], word

    listed = parse_html((await client.http.get(f"/chats/{chat_id}", headers=HTML)).text)
    assert "Shared" in listed.find("nav", aria_label="Chats").norm_text()
    # A message sent with htmx moves the chat's item to the top: still marked.
    moved = await client.send(chat_id, "third", htmx=True)
    items = parse_html(moved.text).find_all("li", id=f"chat-item-{chat_id}")
    assert [i.norm_text() for i in items if i.find_all("a")] == ["first *words* Shared"]
    await client.wait_idle(chat_id)

    assert (await client.http.post(f"/chats/{chat_id}/share")).status_code == 303
    again = parse_html((await client.http.get(f"/s/{token}", headers=HTML)).text)
    assert "second message" in again.norm_text()  # the same link, updated
    assert len(again.find_all("article")) == 6

    assert (await client.http.post(f"/chats/{chat_id}/share/revoke")).status_code == 303
    gone = await client.http.get(f"/s/{token}", headers=HTML)
    assert gone.status_code == 404 and "second message" not in gone.text
    assert gone.headers["x-robots-tag"] == "noindex"
    assert await rows(client.db, "SELECT * FROM share_segments") == []


async def test_unknown_and_malformed_tokens_are_404(web_client_factory: MakeClient):
    client = await web_client_factory()
    for token in ("x", "A" * 43, "../etc", "a" * 500):
        assert (await client.http.get(f"/s/{token}", headers=HTML)).status_code == 404
    chat_id = await client.new_chat()
    token = await _share(client, client.http, chat_id)
    assert (await client.http.get(f"/s/{token}?before=zz", headers=HTML)).status_code == 404


async def test_deleting_the_chat_revokes_its_link(web_client_factory: MakeClient):
    client = await web_client_factory(offline_delay=0)
    chat_id = await client.new_chat()
    await client.send(chat_id, "hello")
    await client.wait_idle(chat_id)
    token = await _share(client, client.http, chat_id)
    assert (await client.http.post(f"/chats/{chat_id}/delete")).status_code == 303
    assert (await client.http.get(f"/s/{token}", headers=HTML)).status_code == 404
    assert await rows(client.db, "SELECT * FROM shares") == []


async def test_a_long_shared_chat_is_read_a_page_at_a_time(web_client_factory: MakeClient):
    client = await web_client_factory(offline_delay=0)
    chat_id = await client.new_chat()
    for n in range(30):
        await client.send(chat_id, f"message number {n}")
        await client.wait_idle(chat_id)
    token = await _share(client, client.http, chat_id)
    page = parse_html((await client.http.get(f"/s/{token}", headers=HTML)).text)
    shown = page.find("section", id="messages").norm_text()
    assert "message number 29" in shown and "message number 0 " not in shown
    earlier = page.find("div", class_="earlier").find("a").attrs["href"] or ""
    older = parse_html((await client.http.get(earlier, headers=HTML)).text)
    shown = older.find("section", id="messages").norm_text()
    assert "message number 0" in shown and "message number 29" not in shown


async def test_modes_and_who_may_open_and_continue(web_client_factory: MakeClient):
    client = await web_client_factory(auth=AuthSettings("password"), offline_delay=0)
    alice = await add_user(client, "alice")
    await add_user(client, "bob")
    async with person(client.app, "alice") as a, person(client.app, "bob") as b:
        chat_id = await new_chat(a)
        await a.post(f"/chats/{chat_id}/messages", data={"text": "shared words"})
        await client.wait_idle(chat_id)
        token = await _share(client, a, chat_id)
        # signed-in (the default): Bob may read it, and continue it as a chat of his own.
        page = parse_html((await b.get(f"/s/{token}", headers=HTML)).text)
        # (a code block's Copy button changes nothing)
        assert _buttons(page) == ["Continue this chat"]
        own = parse_html((await a.get(f"/s/{token}", headers=HTML)).text)
        assert _buttons(own) == []  # the owner has the chat itself
        made = await b.post(f"/s/{token}/continue")
        assert made.status_code == 303
        copy = made.headers["location"].rsplit("/", 1)[1]
        bob_page = parse_html((await b.get(f"/chats/{copy}", headers=HTML)).text)
        assert "shared words" in bob_page.norm_text()
        assert (await a.get(f"/chats/{copy}", headers=HTML)).status_code == 404
        # Nobody signed in: sent to sign in, shown nothing.
        anonymous = await client.http.get(f"/s/{token}", headers=HTML)
        assert anonymous.status_code == 303 and "/login" in anonymous.headers["location"]
        # Disabling Alice revokes her links for good.
        await client.web.store.users.set_disabled(alice.id, True)
        assert (await b.get(f"/s/{token}", headers=HTML)).status_code == 404
        await client.web.store.users.set_disabled(alice.id, False)
        assert (await b.get(f"/s/{token}", headers=HTML)).status_code == 404


async def test_anyone_mode_opens_the_page_without_signing_in(web_client_factory: MakeClient):
    client = await web_client_factory(
        auth=AuthSettings("password", share_links="anyone"), offline_delay=0
    )
    await add_user(client, "alice")
    async with person(client.app, "alice") as a:
        chat_id = await new_chat(a)
        await a.post(f"/chats/{chat_id}/messages", data={"text": "for everyone"})
        await client.wait_idle(chat_id)
        token = await _share(client, a, chat_id)
    page = await client.http.get(f"/s/{token}", headers=HTML)
    assert page.status_code == 200 and "for everyone" in page.text
    assert "Continue this chat" not in page.text
    # Only the page itself is open: continuing needs a person.
    refused = await client.http.post(f"/s/{token}/continue")
    assert refused.status_code == 401
    assert (await client.http.get(f"/chats/{chat_id}", headers=HTML)).status_code == 303


async def test_off_mode_has_no_share_button_and_no_shared_pages(web_client_factory: MakeClient):
    client = await web_client_factory(auth=AuthSettings("none", share_links="off"))
    chat_id = await client.new_chat()
    page = parse_html((await client.http.get(f"/chats/{chat_id}", headers=HTML)).text)
    assert not [a for a in page.find_all("a") if a.norm_text() == "Share"]
    assert (await client.http.get(f"/chats/{chat_id}/share", headers=HTML)).status_code == 404
    assert (await client.http.post(f"/chats/{chat_id}/share")).status_code == 404
    assert await rows(client.db, "SELECT * FROM shares") == []


async def test_anyone_mode_needs_no_access_token_for_the_shared_page_alone(
    web_client_factory: MakeClient,
):
    token = "access-token-1234"
    client = await web_client_factory(
        token=token, auth=AuthSettings("token", share_links="anyone"), offline_delay=0
    )
    client.http.cookies.set("webapp_token", token)
    chat_id = await client.new_chat()
    await client.send(chat_id, "public words")
    await client.wait_idle(chat_id)
    link = await _share(client, client.http, chat_id)
    client.http.cookies.clear()
    page = await client.http.get(f"/s/{link}", headers=HTML)
    assert page.status_code == 200 and "public words" in page.text
    assert (await client.http.get(f"/chats/{chat_id}", headers=HTML)).status_code == 401
    assert (await client.http.get(f"/s/{link}/continue", headers=HTML)).status_code == 401


async def test_a_continued_chat_keeps_the_files_its_messages_brought(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(auth=AuthSettings("password"), offline_delay=0)
    await add_user(client, "alice")
    await add_user(client, "bob")
    async with person(client.app, "alice") as a, person(client.app, "bob") as b:
        chat_id = await new_chat(a)
        sent = await a.post(
            f"/chats/{chat_id}/messages",
            data={"text": "read this"},
            files=[("files", ("memo.txt", b"memo words", "text/plain"))],
        )
        assert sent.status_code in (200, 303), sent.text
        await client.wait_idle(chat_id)
        token = await _share(client, a, chat_id)
        shared = parse_html((await b.get(f"/s/{token}", headers=HTML)).text)
        named = shared.find("li", data_role="attachment")
        assert named.attrs["data-name"] == "memo.txt" and named.find_all("a") == []
        made = await b.post(f"/s/{token}/continue")
        copy = made.headers["location"].rsplit("/", 1)[1]
        assert (await a.post(f"/chats/{chat_id}/delete")).status_code == 303
        page = (await b.get(f"/chats/{copy}", headers=HTML)).text
        found = re.search(rf"/chats/{copy}/files/([0-9a-f]+)", page)
        assert found, page[:500]
        download = await b.get(found.group(0))
        assert download.status_code == 200 and download.content == b"memo words"
