"""Tabs only watch runs; the chat list, limits and reading/posting without JavaScript."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from playwright.sync_api import Page, expect

from .harness import AppServer
from .ui import (
    TOOL,
    button,
    counted,
    last_reply,
    message_box,
    normalized,
    open_new_chat,
    recorded_violations,
    replies,
    reply_states,
    send,
    send_and_wait,
    users,
    wait_for_numbers,
    wait_status,
)

MAX_MESSAGE_CHARS = 100_000  # the app's default limit (SPEC §6, issue: "default 100,000")


def test_second_tab_follows_and_closing_the_first_does_not_stop_the_run(
    app: AppServer, open_page: Callable[..., Page]
) -> None:
    n = 400
    first = open_page(app)
    chat_url = open_new_chat(first)
    send(first, f"count to {n}")
    wait_for_numbers(first, 20)
    run_id = reply_states(first)[-1].run_id

    second = open_page(app)
    second.goto(chat_url)
    reply = wait_status(second, "streaming", timeout=5_000)
    expect(reply).to_have_attribute("data-run-id", run_id or "")
    first.context.close()  # the tab that started the run goes away

    wait_status(second, "completed", timeout=30_000)
    assert not recorded_violations(second), recorded_violations(second)[:3]
    states = reply_states(second)
    assert [s.run_id for s in states] == [run_id]
    assert normalized(states[0].text) == counted(n)


def test_without_javascript_chats_can_be_read_and_messages_posted(
    app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(app, java_script_enabled=False)
    page.goto("/")
    button(page, "New chat").click()
    expect(page).to_have_url(re.compile(r"/chats/[^/]+$"))
    message_box(page).fill("count to 40")
    button(page, "Send").click()
    expect(page).to_have_url(re.compile(r"/chats/[^/]+$"))
    expect(users(page)).to_have_count(1)
    expect(users(page).first).to_contain_text("count to 40")
    # No script streams the reply: reloading (what a no-JS reader does) shows progress.
    deadline = time.monotonic() + 15
    while last_reply(page).get_attribute("data-status") != "completed":
        assert time.monotonic() < deadline, "the reply never showed as completed on reload"
        time.sleep(0.3)
        page.reload()
    content = last_reply(page).locator(".content")
    assert normalized(content.text_content()) == counted(40)


def test_too_long_message_gets_413_alert_and_keeps_the_text(page: Page) -> None:
    open_new_chat(page)
    too_long = "x" * (MAX_MESSAGE_CHARS + 1)
    message_box(page).fill(too_long)
    button(page, "Send").click()
    alert = page.get_by_role("alert").filter(
        has_text=re.compile(r"too long|413|100,?000", re.IGNORECASE)
    )
    expect(alert).to_be_visible()
    assert message_box(page).input_value() == too_long, "the typed text was lost"
    expect(users(page)).to_have_count(0)
    page.reload()
    expect(users(page)).to_have_count(0)


def test_chat_list_titles_new_chat_and_switching(page: Page) -> None:
    chats = page.locator("nav[aria-label=Chats]")
    first_url = open_new_chat(page)
    send_and_wait(page, "what is 12*(3+4)?")
    expect(chats.get_by_role("link", name=re.compile(r"what is 12\*\(3\+4\)"))).to_be_visible()

    second_url = open_new_chat(page)
    assert second_url != first_url
    send_and_wait(page, "count to 3")
    expect(chats.get_by_role("link", name="count to 3", exact=True)).to_be_visible()
    expect(users(page)).to_have_count(1)

    chats.get_by_role("link", name=re.compile(r"what is 12\*\(3\+4\)")).click()
    expect(page).to_have_url(first_url)
    expect(users(page)).to_have_count(1)
    expect(page.locator(TOOL)).to_contain_text("84")
    expect(replies(page)).to_have_count(1)
