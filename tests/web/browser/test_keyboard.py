"""SPEC §18 with the keyboard only: after each action focus is on the natural next control,
never on <body>; Escape closes menus; the skip link lands on every page that has one.

Every action is a key press on a focused control (Enter, Tab, Escape), and every check
reads `document.activeElement` (Playwright's to_be_focused).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from playwright.sync_api import Locator, Page, expect
from webhelpers import write_long_chat

from .harness import TOOL_ANSWER, AppFactory, AppServer
from .ui import (
    TOOL,
    button,
    expect_skip_link_lands,
    expect_version,
    last_reply,
    message_box,
    open_new_chat,
    replies,
    reply_states,
    send,
    send_and_wait,
    users,
    versions,
    wait_for_numbers,
    wait_status,
)


def press(control: Locator, key: str = "Enter") -> None:
    """Focus `control` as Tab would, then press `key` on it."""
    control.focus()
    expect(control).to_be_focused()
    control.page.keyboard.press(key)


def edit_box(page: Page) -> Locator:
    return page.get_by_label("Edit message", exact=True)


# --- Edit, Cancel, Save and send ----------------------------------------------------------


def test_edit_cancel_and_save_and_send_keep_focus(page: Page) -> None:
    open_new_chat(page)
    send_and_wait(page, "count to 3")
    first_run = reply_states(page)[-1].run_id

    press(button(users(page).first, "Edit"))
    expect(edit_box(page)).to_be_focused()  # Edit -> the Edit message box
    page.keyboard.press("Tab")  # the next Tab is the form's own button, not the next reply
    expect(button(page, "Save and send")).to_be_focused()
    page.keyboard.press("Tab")
    expect(button(page, "Cancel")).to_be_focused()
    page.keyboard.press("Enter")  # Cancel -> that message's Edit
    expect(edit_box(page)).to_have_count(0)
    expect(button(users(page).first, "Edit")).to_be_focused()

    page.keyboard.press("Enter")
    expect(edit_box(page)).to_be_focused()
    page.keyboard.press("Control+A")
    page.keyboard.type("count to 4")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")  # Save and send -> the new reply
    reply = last_reply(page)
    expect(reply).not_to_have_attribute("data-run-id", first_run or "")
    expect(reply).to_be_focused()
    # Still there once it has completed: its finished element replaced the streaming one.
    wait_status(page, "completed")
    expect(reply).to_contain_text("1 2 3 4")
    expect(reply).to_be_focused()

    # Save and send with Enter in the box itself does the same.
    press(button(users(page).first, "Edit"))
    expect(edit_box(page)).to_be_focused()
    page.keyboard.press("Control+A")
    page.keyboard.type("count to 2")
    page.keyboard.press("Enter")
    expect(last_reply(page)).to_contain_text("1 2")
    wait_status(page, "completed")
    expect(last_reply(page)).to_be_focused()


_FOCUS_RING_ON_A_REPLY = (
    "() => document.activeElement.matches('[data-role=assistant]:focus-visible')"
    " && getComputedStyle(document.activeElement).outlineStyle === 'solid'"
)


def test_without_javascript_edit_lands_in_the_edit_box(
    app: AppServer, open_page: Callable[..., Page]
) -> None:
    setup = open_page(app)
    chat = open_new_chat(setup)
    send_and_wait(setup, "count to 2")
    page = open_page(app, java_script_enabled=False)
    page.goto(chat)
    press(button(users(page).first, "Edit"))  # a plain form: the chat page, editing
    expect(page).to_have_url(re.compile(r"/edit\??$"))
    expect(edit_box(page)).to_be_focused()
    page.keyboard.press("Tab")
    expect(button(page, "Save and send")).to_be_focused()


# --- Regenerate and the version switcher --------------------------------------------------


def test_regenerate_and_versions_keep_focus(page: Page) -> None:
    open_new_chat(page)
    send_and_wait(page, "count to 3")
    for count in (2, 3):
        old = reply_states(page)[-1].run_id or ""
        press(button(last_reply(page), "Regenerate"))  # Regenerate -> the new reply
        expect(last_reply(page)).not_to_have_attribute("data-run-id", old)
        expect(last_reply(page)).to_be_focused()
        wait_status(page, "completed")
        expect(last_reply(page)).to_be_focused()
        # ... and a sighted keyboard user sees where focus is (WCAG 2.4.7).
        page.wait_for_function(_FOCUS_RING_ON_A_REPLY, timeout=5_000)
        expect_version(last_reply(page), count, count)

    switcher = versions(last_reply(page))
    press(button(switcher, "Previous version"))  # 3/3 -> 2/3: the same button
    expect_version(last_reply(page), 2, 3)
    expect(button(versions(last_reply(page)), "Previous version")).to_be_focused()
    page.keyboard.press("Enter")  # 2/3 -> 1/3: Previous is disabled there, so Next
    expect_version(last_reply(page), 1, 3)
    expect(button(versions(last_reply(page)), "Next version")).to_be_focused()
    page.keyboard.press("Enter")  # 1/3 -> 2/3: the same button
    expect_version(last_reply(page), 2, 3)
    expect(button(versions(last_reply(page)), "Next version")).to_be_focused()
    page.keyboard.press("Enter")  # -> 3/3: Next is disabled there, so Previous
    expect_version(last_reply(page), 3, 3)
    expect(button(versions(last_reply(page)), "Previous version")).to_be_focused()


def test_a_user_message_switcher_keeps_focus(page: Page) -> None:
    open_new_chat(page)
    send_and_wait(page, "count to 3")
    press(button(users(page).first, "Edit"))
    expect(edit_box(page)).to_be_focused()
    page.keyboard.press("Control+A")
    page.keyboard.type("count to 5")
    page.keyboard.press("Enter")
    expect(last_reply(page)).to_contain_text("1 2 3 4 5")
    wait_status(page, "completed")
    expect_version(users(page).first, 2, 2)

    press(button(versions(users(page).first), "Previous version"))
    expect_version(users(page).first, 1, 2)
    expect(users(page).first).to_contain_text("count to 3")
    expect(button(versions(users(page).first), "Next version")).to_be_focused()
    page.keyboard.press("Enter")
    expect_version(users(page).first, 2, 2)
    expect(button(versions(users(page).first), "Previous version")).to_be_focused()


# --- Stop ---------------------------------------------------------------------------------


def test_stop_puts_focus_on_the_stopped_reply(page: Page) -> None:
    open_new_chat(page)
    send(page, "count to 2000")
    wait_for_numbers(page, 10)
    run_id = reply_states(page)[-1].run_id or ""
    press(button(last_reply(page), "Stop"))  # Stop -> the stopped reply
    reply = wait_status(page, "stopped")
    expect(reply).to_have_attribute("data-run-id", run_id)
    expect(reply).to_be_focused()


def test_escape_in_the_message_box_stops_and_leaves_focus_there(page: Page) -> None:
    open_new_chat(page)
    send(page, "count to 2000")
    wait_for_numbers(page, 10)
    message_box(page).focus()
    page.keyboard.type("next question")
    page.keyboard.press("Escape")
    wait_status(page, "stopped")
    expect(message_box(page)).to_be_focused()  # typing goes on where it was
    expect(message_box(page)).to_have_value("next question")


# --- Escape closes menus --------------------------------------------------------------------


def _menu(page: Page, summary: str) -> tuple[Locator, Locator]:
    label = page.locator("summary", has_text=re.compile(f"^{summary}$"))
    return page.locator("details").filter(has=label), label


def test_escape_closes_more_and_chat_options_and_returns_to_the_summary(page: Page) -> None:
    open_new_chat(page)
    send_and_wait(page, "count to 2")
    more, more_summary = _menu(page, "More")
    press(more_summary)  # Enter opens a <details>
    expect(more).to_have_attribute("open", "")
    page.keyboard.press("Tab")
    expect(page.get_by_label("Chat file")).to_be_focused()
    page.keyboard.press("Escape")
    expect(more).not_to_have_attribute("open", "")
    expect(more_summary).to_be_focused()

    options, options_summary = _menu(page, "Chat options")
    press(options_summary)
    expect(options).to_have_attribute("open", "")
    page.keyboard.press("Tab")
    expect(page.get_by_label("Title", exact=True)).to_be_focused()
    page.keyboard.press("Escape")
    expect(options).not_to_have_attribute("open", "")
    expect(options_summary).to_be_focused()

    # While a reply streams, Escape in a menu closes the menu and does not stop the reply.
    message_box(page).fill("count to 2000")
    message_box(page).press("Enter")
    expect(replies(page)).to_have_count(2)
    wait_for_numbers(page, 5)
    press(options_summary)
    expect(options).to_have_attribute("open", "")
    page.keyboard.press("Tab")
    page.keyboard.press("Escape")
    expect(options).not_to_have_attribute("open", "")
    expect(options_summary).to_be_focused()
    expect(last_reply(page)).to_have_attribute("data-status", "streaming")
    page.keyboard.press("Escape")  # no menu open now: Escape stops the reply
    wait_status(page, "stopped")


# --- Allow and Deny -----------------------------------------------------------------------


def _call(page: Page, tool: str, **arguments: object) -> Locator:
    send(page, f"call {tool} {json.dumps(arguments)}")
    reply = wait_status(page, "waiting")
    card = reply.locator(f"{TOOL}[data-approval=waiting]")
    expect(card).to_have_count(1)
    return card


def test_allow_and_deny_put_focus_on_the_reply_that_resumes(
    tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(tools_app)
    open_new_chat(page)
    for decision, answer in (("Allow", "wrote 'kbd-1'"), ("Deny", "declined")):
        card = _call(page, "test__write_note", text="kbd-1")
        run_id = last_reply(page).get_attribute("data-run-id")
        press(button(card, decision))
        reply = wait_status(page, "completed")
        expect(reply).to_have_attribute("data-run-id", run_id or "")
        expect(reply.locator(".content")).to_contain_text(f"{TOOL_ANSWER}")
        expect(reply.locator(".content")).to_contain_text(answer)
        expect(reply).to_be_focused()


# --- Earlier messages ----------------------------------------------------------------------


def test_loading_earlier_messages_puts_focus_on_the_oldest(
    start_app: AppFactory, open_page: Callable[..., Page], tmp_path: Path
) -> None:
    # Playwright's sync API runs an event loop in this thread: write from another.
    with ThreadPoolExecutor(1) as pool:
        chat_id = pool.submit(
            asyncio.run, write_long_chat(tmp_path / "chat.db", "A longer conversation", 30)
        ).result()
    page = open_page(start_app())
    page.goto(f"/chats/{chat_id}")
    expect(page.locator("[data-role=user] .content").first).not_to_have_text("question 0")
    # Focused, it scrolls into view, which loads the page by itself (hx-trigger intersect);
    # Enter, if it is still there, does the same.
    link = page.get_by_role("link", name="Load earlier messages", exact=True)
    link.focus()
    if link.count():
        page.keyboard.press("Enter")
    oldest = page.locator("[data-role=user]").first
    expect(oldest.locator(".content")).to_have_text("question 0")
    expect(oldest).to_be_focused()


# --- Skip links ---------------------------------------------------------------------------


def test_the_skip_link_lands_on_every_page(page: Page) -> None:
    chat = open_new_chat(page)
    send_and_wait(page, "count to 2")
    chat_path = "/" + chat.split("/", 3)[3]
    expect_skip_link_lands(page, "/", "message")
    expect_skip_link_lands(page, chat_path, "message")
    expect_skip_link_lands(page, "/tools", "main")
    expect_skip_link_lands(page, "/search?q=count", "main")
    expect_skip_link_lands(page, "/chats/no-such-chat", "main")
    expect_skip_link_lands(page, chat_path + "/delete", "main")
