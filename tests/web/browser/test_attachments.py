"""SPEC §14 in a real Chromium: attach, see, download, send, regenerate, edit with Keep,
continue, no JavaScript, kill -9 mid-reply, and another person's 404."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, expect

from .harness import CUT_SHORT_CUE, AppServer, EndpointApp
from .test_accounts import PASSWORD, _add_user
from .ui import (
    button,
    message_box,
    open_new_chat,
    replies,
    users,
    wait_for_numbers,
    wait_status,
)

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)
NOTES = b"Shopping list\nmilk\nbread\n"


def _file(name: str, data: bytes) -> dict[str, Any]:
    return {"name": name, "mimeType": "application/octet-stream", "buffer": data}


def _attach(page: Page, *files: dict[str, Any], scope: Any = None) -> None:
    (scope or page).get_by_label("Attach files").set_input_files(list(files))


def _user_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    users_ = [m for m in body["messages"] if m["role"] == "user"]
    content = users_[-1]["content"]
    assert isinstance(content, list), content
    return content


def _shown(page: Page, index: int = -1) -> list[str]:
    message = users(page).nth(index) if index >= 0 else users(page).last
    items = message.locator('[data-role="attachment"]')
    return [str(items.nth(i).get_attribute("data-name")) for i in range(items.count())]


def test_attach_see_download_send_regenerate_edit_and_continue(
    numbered_app: EndpointApp, open_page: Callable[..., Page]
) -> None:
    server, endpoint = numbered_app.server, numbered_app.endpoint
    page = open_page(server)
    open_new_chat(page)
    message_box(page).fill("What do you make of these?")
    _attach(page, _file("notes.txt", NOTES), _file("dot.png", PNG))
    button(page, "Send").click()
    wait_status(page, "completed")
    assert _shown(page) == ["notes.txt", "dot.png"]
    notes = users(page).last.locator('[data-role="attachment"][data-name="notes.txt"]')
    expect(notes).to_have_attribute("data-context", "whole")
    expect(users(page).last.get_by_role("img", name="dot.png")).to_be_visible()
    # The message box and the file input are empty again for the next message.
    expect(page.get_by_label("Attach files")).to_have_js_property("files.length", 0)

    with page.expect_download() as download:
        notes.get_by_role("link", name="notes.txt").click()
    assert Path(download.value.path()).read_bytes() == NOTES
    assert download.value.suggested_filename == "notes.txt"

    first = _user_parts(endpoint.requests[-1])
    assert first[0] == {"type": "text", "text": "What do you make of these?"}
    assert first[1] == {"type": "text", "text": "[notes.txt]\n" + NOTES.decode()}
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert first[2] == {"type": "image_url", "image_url": {"url": url}}

    sent = len(endpoint.requests)
    button(replies(page).last, "Regenerate").click()
    expect(replies(page).last).to_contain_text(f"fake reply #{sent + 1}")
    wait_status(page, "completed")
    assert _user_parts(endpoint.requests[-1]) == first

    button(users(page).last, "Edit").click()
    form = page.locator("form.edit-form")
    form.get_by_label("Keep dot.png").uncheck()
    expect(form.get_by_label("Keep notes.txt")).to_be_checked()
    _attach(page, _file("more.md", b"# More\ntext"), scope=form)
    form.get_by_label("Edit message").fill("And now?")
    button(form, "Save and send").click()
    expect(users(page).last.locator(".content")).to_have_text("And now?")
    wait_status(page, "completed")
    assert _shown(page) == ["notes.txt", "more.md"]
    texts = [p.get("text") for p in _user_parts(endpoint.requests[-1])]
    assert texts == ["And now?", "[notes.txt]\n" + NOTES.decode(), "[more.md]\n# More\ntext"]

    before = replies(page).count()
    message_box(page).fill(f"Please {CUT_SHORT_CUE}")
    _attach(page, _file("cut.txt", b"cut text"))
    button(page, "Send").click()
    expect(replies(page)).to_have_count(before + 1)
    reply = wait_status(page, "completed")
    cut = _user_parts(endpoint.requests[-1])
    asked = len(endpoint.requests)
    button(reply, "Continue").click()
    expect(replies(page).last).to_contain_text(f"fake reply #{asked + 1}")
    wait_status(page, "completed")
    assert len(endpoint.requests) == asked + 1
    # The continuation's request carries the same message with the same file.
    assert _user_parts(endpoint.requests[-1]) == cut


def test_attach_and_send_without_javascript(app: AppServer, open_page: Callable[..., Page]) -> None:
    page = open_page(app, java_script_enabled=False)
    open_new_chat(page)
    message_box(page).fill("Read this")
    _attach(page, _file("plain.csv", b"a,b\n1,2\n"))
    button(page, "Send").click()
    expect(page).to_have_url(re.compile(r"/chats/[^/]+$"))
    for _ in range(50):  # without JavaScript the reply is there on a reload once done
        if replies(page).count() and replies(page).last.get_attribute("data-status") == "completed":
            break
        page.wait_for_timeout(200)
        page.reload()
    assert _shown(page) == ["plain.csv"]
    expect(replies(page).last).to_contain_text("Attached: plain.csv (text/plain, 8 bytes)")
    expect(replies(page).last).to_contain_text("plain.csv begins: a,b")

    # A hostile file is refused by name, the text stays in the box.
    message_box(page).fill("And this")
    _attach(page, _file("evil.png", b"\x7fELF" + bytes(64)))
    button(page, "Send").click()
    expect(page.get_by_role("alert")).to_contain_text("evil.png")
    expect(message_box(page)).to_have_value("And this")
    expect(users(page)).to_have_count(1)


def test_kill_9_mid_reply_resumes_with_the_same_files(
    start_app: Callable[..., AppServer], open_page: Callable[..., Page]
) -> None:
    server = start_app()
    page = open_page(server)
    chat_url = open_new_chat(page)
    message_box(page).fill("count to 1000")
    _attach(page, _file("list.txt", b"first item\nsecond item\n"))
    button(page, "Send").click()
    wait_for_numbers(page, 30)
    server.kill()
    server.start()
    page.goto(chat_url)
    reply = wait_status(page, "completed", timeout=60_000)
    text = reply.inner_text()
    assert text.count("Attached: list.txt (text/plain, 23 bytes)") == 1
    assert "list.txt begins: first item" in text
    assert "1000" in text
    assert _shown(page) == ["list.txt"]


def test_another_persons_file_is_404(
    start_app: Callable[..., AppServer], open_page: Callable[..., Page], tmp_path: Path
) -> None:
    _add_user(tmp_path / "chat.db", "alice")
    _add_user(tmp_path / "chat.db", "bob")
    server = start_app("--auth", "password")
    pages = {}
    for name in ("alice", "bob"):
        page = open_page(server)
        page.goto("/login")
        page.get_by_label("User name").fill(name)
        page.get_by_label("Password").fill(PASSWORD)
        button(page, "Sign in").click()
        expect(page).to_have_url(re.compile(r"/$"))
        pages[name] = page
    alice = pages["alice"]
    open_new_chat(alice)
    message_box(alice).fill("mine")
    _attach(alice, _file("private.txt", b"alice's secret"))
    button(alice, "Send").click()
    wait_status(alice, "completed")
    link = users(alice).last.get_by_role("link", name="private.txt")
    href = str(link.get_attribute("href"))
    assert alice.request.get(href).body() == b"alice's secret"
    answer = pages["bob"].request.get(href)
    assert answer.status == 404
    assert b"alice" not in answer.body()


_DROP_AND_PASTE_JS = """
([kind, name, text]) => {
  const box = document.getElementById("message");
  const files = new DataTransfer();
  files.items.add(new File([text], name, {type: "text/plain"}));
  const event = kind === "drop"
    ? new DragEvent("drop", {dataTransfer: files, bubbles: true, cancelable: true})
    : new ClipboardEvent("paste", {clipboardData: files, bubbles: true, cancelable: true});
  box.dispatchEvent(event);
  return event.defaultPrevented;
}
"""


def test_a_file_dropped_or_pasted_on_the_message_box_is_attached(
    app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(app)
    open_new_chat(page)
    message_box(page).fill("Two ways in")
    assert page.evaluate(_DROP_AND_PASTE_JS, ["drop", "dropped.txt", "dropped text"])
    assert page.evaluate(_DROP_AND_PASTE_JS, ["paste", "pasted.txt", "pasted text"])
    expect(page.get_by_label("Attach files")).to_have_js_property("files.length", 2)
    button(page, "Send").click()
    reply = wait_status(page, "completed")
    assert _shown(page) == ["dropped.txt", "pasted.txt"]
    expect(reply).to_contain_text("dropped.txt begins: dropped text")
    expect(reply).to_contain_text("pasted.txt begins: pasted text")
