"""A chat as a file (SPEC §8): Markdown and JSON export from Chat options, JSON import.

Every test works in a chat of its own on the module's offline app. The chat used is
"what is 12*(3+4)?" regenerated once: a tool call, and a reply with two versions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, expect

from .harness import AppFactory, AppServer
from .ui import (
    button,
    chat_links,
    download_export,
    expect_version,
    open_new_chat,
    regenerate_button,
    replies,
    send_and_wait,
    users,
    wait_status,
)

QUESTION = "what is 12*(3+4)?"
MAX_FILE_BYTES = 10 * 1024 * 1024  # the app's default import limit (SPEC §8: 10 MB)
# ... plus a message's worth of attached files (SPEC §14), with --max-attachment-mb 0.1.
IMPORT_LIMIT = MAX_FILE_BYTES + 10 * int(0.1 * 1024 * 1024) * 4 // 3
IMPORTED_CHAT = re.compile(r"/chats/(?!import$)[^/]+$")  # where a successful import lands

# What a reader sees of the conversation, in order: each message, reply and tool card
# with its visible text (ids, run ids and times are not shown, so they do not count).
_SHOWN_JS = """
() => Array.from(document.querySelectorAll('#messages [data-role]')).map(e =>
  e.getAttribute('data-role') + ': ' + e.innerText.replace(/\\s+/g, ' ').trim())
"""


def _shown(page: Page) -> list[str]:
    shown: list[str] = page.evaluate(_SHOWN_JS)
    return shown


def _regenerated_calculation(page: Page) -> str:
    """A new chat with QUESTION answered twice (Regenerate); returns its URL."""
    chat_url = open_new_chat(page)
    send_and_wait(page, QUESTION)
    first = replies(page).first
    old = first.get_attribute("data-run-id") or ""
    regenerate_button(first).click()
    expect(first).not_to_have_attribute("data-run-id", old)
    wait_status(page, "completed", index=0)
    expect_version(first, 2, 2)
    return chat_url


def _import(page: Page, file: Path) -> int:
    """Choose `file` in Chat file, press Import and wait for the page it leads to (the
    new chat, or the refusal); returns the HTTP status of the POST itself."""
    page.get_by_text("More", exact=True).click()  # Import is folded away beside New chat
    page.get_by_label("Chat file", exact=True).set_input_files(file)
    with page.expect_navigation(wait_until="load") as navigated:
        button(page, "Import").click()
    landed = navigated.value
    assert landed is not None
    posted = landed.request.redirected_from or landed.request
    assert posted.method == "POST" and posted.url.endswith("/chats/import"), posted.url
    response = posted.response()
    assert response is not None
    return response.status


def _assert_json_export(name: str, data: bytes) -> dict[str, Any]:
    assert name == "what-is-12-3-4.json", name  # from Content-Disposition, not the link
    document: dict[str, Any] = json.loads(data)
    assert document["format_version"] == 1, document.get("format_version")
    assert document["title"] == QUESTION
    runs = document["runs"]
    assert len(runs) == 2, f"every version is exported, not only the shown one: {runs}"
    for run in runs:
        kinds = [entry["type"] for entry in run["entries"]]
        assert kinds == ["user", "tool_call", "tool_result", "assistant"], kinds
        assert run["entries"][0]["text"] == QUESTION
        assert run["entries"][1]["name"] == "calculator"
        assert run["entries"][3]["text"] == "12*(3+4) = 84"
    return document


def _assert_markdown_export(name: str, data: bytes) -> None:
    assert name == "what-is-12-3-4.md", name
    text = data.decode("utf-8")
    assert text.startswith(f"# {QUESTION}\n"), text[:200]
    # The shown conversation once: the message, the tool call with its arguments and
    # result, and the reply.
    for part in (QUESTION, "calculator", '"expression": "12*(3+4)"', "84", "12*(3+4) = 84"):
        assert part in text, f"{part!r} missing from the Markdown export:\n{text}"
    assert text.count("## You") == 1 and text.count("## Assistant") == 1, text


def test_export_downloads_markdown_and_json_with_every_version(page: Page) -> None:
    _regenerated_calculation(page)
    _assert_markdown_export(*download_export(page, "Markdown"))
    _assert_json_export(*download_export(page, "JSON"))


def test_an_imported_export_is_a_new_chat_that_goes_on(page: Page, tmp_path: Path) -> None:
    original_url = _regenerated_calculation(page)
    original = _shown(page)
    assert len(original) == 3 and "12*(3+4) = 84" in original[1], original
    file = tmp_path / "exported.json"
    file.write_bytes(download_export(page, "JSON")[1])
    before = chat_links(page)

    assert _import(page, file) == 303
    expect(page).to_have_url(IMPORTED_CHAT)
    imported_url = page.url
    assert imported_url != original_url
    expect(page.get_by_role("heading", level=1)).to_have_text(QUESTION)
    assert _shown(page) == original
    expect_version(replies(page).first, 2, 2)
    # The new chat heads the list; the original is still in it, below.
    after = chat_links(page)
    assert len(after) == len(before) + 1, after
    assert after[0][0] == QUESTION and imported_url.endswith(after[0][1]), after
    assert after[1:] == before

    # Both versions came along: the older one is a switch away, and the chat goes on.
    button(replies(page).first, "Previous version").click()
    expect_version(replies(page).first, 1, 2)
    send_and_wait(page, "count to 3")
    expect(users(page)).to_have_count(2)
    expect(replies(page).last).to_contain_text("1 2 3")

    page.goto(original_url)
    assert _shown(page) == original


BAD_FILES: list[tuple[str, bytes, int, str]] = [
    ("not-json", b"this is not JSON {", 400, r"not JSON \(line 1, column 1"),
    ("a-list", b"[]", 400, r"JSON object with format_version"),
    (
        "newer-format",
        json.dumps({"format_version": 99, "title": "From the future", "runs": []}).encode(),
        400,
        r"format version 99, newer than this app reads",
    ),
    ("empty", b"", 400, r"The file is empty"),
    ("over-10-mb", b"", 413, rf"larger than {IMPORT_LIMIT:,} bytes"),
]


def _bad_file(tmp_path: Path, name: str, content: bytes) -> Path:
    file = tmp_path / f"{name}.json"
    if name == "over-10-mb":
        # Valid JSON one byte over the limit: only its size is wrong.
        head = b'{"format_version": 1, "title": "big", "runs": [], "padding": "'
        tail = b'"}'
        content = head + b"x" * (IMPORT_LIMIT + 1 - len(head) - len(tail)) + tail
        assert len(content) == IMPORT_LIMIT + 1
    file.write_bytes(content)
    return file


def test_bad_files_are_refused_with_the_reason_and_nothing_is_written(
    start_app: AppFactory, open_page: Callable[..., Page], tmp_path: Path
) -> None:
    page = open_page(start_app("--max-attachment-mb", "0.1"))
    open_new_chat(page)
    send_and_wait(page, "count to 2")  # at least one chat in the list to keep
    page.goto("/")
    before = chat_links(page)
    assert before
    alert = page.locator("#composer-alert")
    for name, content, status, reason in BAD_FILES:
        answered = _import(page, _bad_file(tmp_path, name, content))
        assert answered == status, f"{name}: HTTP {answered}"
        expect(alert).to_have_role("alert")
        expect(alert).to_have_text(re.compile(reason))
        assert chat_links(page) == before, f"{name}: the chat list changed"
        # The home page, ready for the next attempt: no chat was opened.
        expect(page.get_by_role("heading", level=1)).to_have_text("New chat")
    page.goto("/")
    assert chat_links(page) == before


def test_export_and_import_work_without_javascript(
    app: AppServer, open_page: Callable[..., Page], tmp_path: Path
) -> None:
    chat_url = _regenerated_calculation(open_page(app))
    page = open_page(app, java_script_enabled=False)
    page.goto(chat_url)
    original = _shown(page)
    _assert_markdown_export(*download_export(page, "Markdown"))
    name, data = download_export(page, "JSON")
    _assert_json_export(name, data)
    file = tmp_path / name
    file.write_bytes(data)

    before = chat_links(page)
    assert _import(page, _bad_file(tmp_path, "a-list", b"[]")) == 400
    expect(page.locator("#composer-alert")).to_contain_text("JSON object")
    assert chat_links(page) == before

    assert _import(page, file) == 303
    expect(page).to_have_url(IMPORTED_CHAT)
    assert page.url != chat_url
    assert _shown(page) == original
    expect_version(replies(page).first, 2, 2)
    assert len(chat_links(page)) == len(before) + 1
