"""Versions (SPEC §7): what Edit and Regenerate replace is kept, and the switcher shows it.

Every test works in a chat of its own on the module's app; the kill -9 test starts its
own server. Replies are identified by data-run-id: each version is a run of its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from playwright.sync_api import Page, expect

from .harness import AppFactory, EndpointApp, numbered_reply
from .ui import (
    ReplyState,
    assert_contiguous_prefix,
    button,
    counted,
    expect_version,
    normalized,
    numbers,
    open_new_chat,
    regenerate_button,
    replies,
    reply_states,
    send,
    send_and_wait,
    switch_version,
    users,
    versions,
    wait_for_numbers,
    wait_status,
)

# Short counts answer in a few chunks, so a test with several turns stays fast, and
# every turn's reply text is its own.
FIRST, SECOND, THIRD = "count to 3", "count to 4", "count to 5"
EDITED = "count to 6"


def _edit(page: Page, index: int, text: str) -> None:
    """Edit the index-th user message to `text` and wait for its new reply to complete."""
    button(users(page).nth(index), "Edit").click()
    box = page.get_by_label("Edit message", exact=True)
    box.fill(text)
    button(page, "Save and send").click()
    expect(users(page)).to_have_count(index + 1)
    expect(users(page).nth(index)).to_contain_text(text)
    expect(replies(page)).to_have_count(index + 1)
    wait_status(page, "completed")


def _regenerate(page: Page, index: int) -> ReplyState:
    """Regenerate the index-th reply; returns the new version once it has completed."""
    old = reply_states(page)[index].run_id or ""
    regenerate_button(replies(page).nth(index)).click()
    expect(replies(page).nth(index)).not_to_have_attribute("data-run-id", old)
    wait_status(page, "completed", index=index)
    return reply_states(page)[index]


def _assert_shown(page: Page, user_texts: list[str], shown: list[ReplyState]) -> None:
    """Exactly these messages and these replies (same runs, same status, same text)."""
    expect(users(page)).to_have_count(len(user_texts))
    for i, text in enumerate(user_texts):
        expect(users(page).nth(i)).to_contain_text(text)
    expect(replies(page)).to_have_count(len(shown))
    assert reply_states(page) == shown


def test_regenerate_a_stopped_reply_and_flip_between_its_versions(page: Page) -> None:
    open_new_chat(page)
    send(page, "count to 200")
    wait_for_numbers(page, 10)
    button(page, "Stop").click()
    wait_status(page, "stopped")
    stopped = reply_states(page)[0]
    kept = numbers(stopped.text)
    assert_contiguous_prefix(kept, "stopped reply")
    assert len(kept) < 200, "the reply finished before Stop: nothing to regenerate from"
    reply = replies(page).first
    expect(versions(reply)).to_have_count(0)

    regenerated = _regenerate(page, 0)
    assert normalized(regenerated.text) == counted(200)
    expect(replies(page)).to_have_count(1)
    expect(users(page)).to_have_count(1)
    expect_version(reply, 2, 2)

    def shows_the_stopped_version() -> None:
        expect_version(reply, 1, 2)
        expect(reply.get_by_text("Stopped", exact=True)).to_be_visible()
        _assert_shown(page, ["count to 200"], [stopped])

    def shows_the_regenerated_version() -> None:
        expect_version(reply, 2, 2)
        expect(reply.get_by_text("Stopped", exact=True)).to_have_count(0)
        _assert_shown(page, ["count to 200"], [regenerated])

    switch_version(reply, "Previous version", 1, 2)
    shows_the_stopped_version()
    switch_version(reply, "Next version", 2, 2)
    shows_the_regenerated_version()
    switch_version(reply, "Previous version", 1, 2)
    page.reload()
    shows_the_stopped_version()


def test_previous_version_of_an_edited_message_brings_back_the_original_turns(
    page: Page,
) -> None:
    open_new_chat(page)
    originals = [send_and_wait(page, text) for text in (FIRST, SECOND, THIRD)]
    _edit(page, 0, EDITED)
    edited = reply_states(page)
    assert edited[0].run_id not in {r.run_id for r in originals}
    message = users(page).first
    expect_version(message, 2, 2)

    switch_version(message, "Previous version", 1, 2)
    _assert_shown(page, [FIRST, SECOND, THIRD], originals)
    # Only the edited message has versions; the turns after it have one each.
    expect(page.get_by_role("group", name="Versions", exact=True)).to_have_count(1)

    switch_version(message, "Next version", 2, 2)
    _assert_shown(page, [EDITED], edited)
    expect(page.locator("[data-role]").filter(has_text=SECOND)).to_have_count(0)


def test_regenerate_an_earlier_reply_keeps_the_turns_after_it_in_the_old_version(
    page: Page,
) -> None:
    open_new_chat(page)
    originals = [send_and_wait(page, text) for text in (FIRST, SECOND)]
    regenerated = _regenerate(page, 0)
    # The later turn belongs to the first reply's old version: not on this path.
    _assert_shown(page, [FIRST], [regenerated])
    expect_version(replies(page).first, 2, 2)

    switch_version(replies(page).first, "Previous version", 1, 2)
    _assert_shown(page, [FIRST, SECOND], originals)


def test_nested_versions_keep_the_version_chosen_in_them(page: Page) -> None:
    open_new_chat(page)
    first = send_and_wait(page, FIRST)
    original_second = send_and_wait(page, SECOND)
    regenerated_second = _regenerate(page, 1)
    assert regenerated_second.run_id != original_second.run_id
    second = replies(page).nth(1)
    # Choose the older version of the second reply: not the one a default would pick.
    switch_version(second, "Previous version", 1, 2)
    _assert_shown(page, [FIRST, SECOND], [first, original_second])

    _edit(page, 0, EDITED)
    expect_version(users(page).first, 2, 2)
    switch_version(users(page).first, "Previous version", 1, 2)
    _assert_shown(page, [FIRST, SECOND], [first, original_second])
    expect_version(second, 1, 2)
    page.reload()
    _assert_shown(page, [FIRST, SECOND], [first, original_second])
    expect_version(users(page).first, 1, 2)
    expect_version(second, 1, 2)


def test_a_switch_while_a_reply_streams_is_refused_and_changes_nothing(page: Page) -> None:
    open_new_chat(page)
    send_and_wait(page, FIRST)
    shown = _regenerate(page, 0)
    first = replies(page).first
    expect_version(first, 2, 2)
    send(page, "count to 2000")
    wait_for_numbers(page, 10)

    button(versions(first), "Previous version").click()
    busy = page.get_by_role("alert").filter(has_text=re.compile("still running", re.IGNORECASE))
    expect(busy).to_be_visible()
    expect_version(first, 2, 2)
    expect(first).to_have_attribute("data-run-id", shown.run_id or "")
    expect(users(page)).to_have_count(2)
    expect(replies(page)).to_have_count(2)
    expect(replies(page).last).to_have_attribute("data-status", "streaming")

    button(page, "Stop").click()  # the run would otherwise count on for 20 s
    wait_status(page, "stopped")
    assert reply_states(page)[0] == shown


def _conversation(request: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of the user and assistant messages a model request carried."""
    found = []
    for message in request["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        if message["role"] in ("user", "assistant"):
            found.append((message["role"], content or ""))
    return found


def test_the_model_is_sent_only_the_versions_on_screen(
    numbered_app: EndpointApp, open_page: Callable[..., Page]
) -> None:
    endpoint = numbered_app.endpoint
    page = open_page(numbered_app.server)
    open_new_chat(page)
    before = len(endpoint.requests)
    first, second, third = (numbered_reply(before + n) for n in (1, 2, 3))
    send_and_wait(page, FIRST)
    expect(replies(page).first).to_contain_text(first)
    _regenerate(page, 0)
    expect(replies(page).first).to_contain_text(second)
    switch_version(replies(page).first, "Previous version", 1, 2)
    expect(replies(page).first).to_contain_text(first)

    send_and_wait(page, SECOND)
    expect(replies(page).last).to_contain_text(third)
    assert len(endpoint.requests) == before + 3, "switching versions must not call the model"
    sent = _conversation(endpoint.requests[-1])
    assert sent == [("user", FIRST), ("assistant", first), ("user", SECOND)], (
        f"the model was sent another path than the one on screen: {json.dumps(sent)}"
    )


def test_kill_9_during_a_regenerate_keeps_the_old_version(
    start_app: AppFactory, open_page: Callable[..., Page]
) -> None:
    n = 150  # 1.5 s at 10 ms a number: the regenerated run is killed well before its end
    server = start_app()
    page = open_page(server)
    chat_url = open_new_chat(page)
    original = send_and_wait(page, f"count to {n}")
    assert normalized(original.text) == counted(n)

    regenerate_button(replies(page).first).click()
    expect(replies(page).first).not_to_have_attribute("data-run-id", original.run_id or "")
    seen = wait_for_numbers(page, 10)
    regenerated_id = reply_states(page)[0].run_id
    server.kill()
    assert seen < n, "the regenerated reply finished before the kill"

    server.start()
    page.goto(chat_url)
    reply = replies(page).first
    expect(reply).to_have_attribute("data-run-id", regenerated_id or "")
    wait_status(page, "completed", timeout=30_000)
    expect(users(page)).to_have_count(1)
    expect(replies(page)).to_have_count(1)
    assert normalized(reply_states(page)[0].text) == counted(n)
    expect_version(reply, 2, 2)

    switch_version(reply, "Previous version", 1, 2)
    _assert_shown(page, [f"count to {n}"], [original])
    page.reload()
    _assert_shown(page, [f"count to {n}"], [original])
    expect_version(reply, 1, 2)
