"""The actions inside each reply and message (SPEC §7): Branch, Continue, Copy, and
what of them works without JavaScript."""

from __future__ import annotations

import re
from collections.abc import Callable

from playwright.sync_api import Locator, Page, expect

from .harness import CUT_SHORT_CUE, AppServer, EndpointApp, numbered_reply
from .ui import (
    assert_contiguous_prefix,
    button,
    counted,
    expect_version,
    normalized,
    numbers,
    open_new_chat,
    recorded_states,
    recorded_violations,
    regenerate_button,
    replies,
    reply_states,
    send,
    send_and_wait,
    switch_version,
    users,
    wait_for_numbers,
    wait_status,
)

CUT_SHORT_LABEL = "Cut short at the model's output limit"


def _stopped_count(page: Page, n: int) -> list[int]:
    """Send "count to n" and Stop it early; returns the numbers the stopped reply kept."""
    send(page, f"count to {n}")
    wait_for_numbers(page, 20)
    button(page, "Stop").click()
    wait_status(page, "stopped")
    kept = numbers(reply_states(page)[-1].text)
    assert_contiguous_prefix(kept, "stopped reply")
    assert len(kept) < n, "the reply finished before Stop"
    return kept


def _chat_link(page: Page, title: str) -> Locator:
    chats = page.get_by_role("navigation", name="Chats", exact=True)
    return chats.get_by_role("link", name=title, exact=True)


def test_branch_opens_a_new_chat_up_to_that_reply_and_leaves_the_original(page: Page) -> None:
    title = "count to 7"  # short replies keep the test fast; the title is the first message
    open_new_chat(page)
    send_and_wait(page, title)
    regenerate_button(replies(page).first).click()
    expect_version(replies(page).first, 2, 2)
    wait_status(page, "completed", index=0)
    send_and_wait(page, "count to 8")
    original_url = page.url
    original = reply_states(page)

    button(replies(page).first, "Branch").click()
    expect(page).not_to_have_url(original_url)
    expect(page.get_by_role("heading", level=1)).to_have_text(f"{title} (branch)")
    expect(_chat_link(page, f"{title} (branch)")).to_have_attribute("aria-current", "page")
    # The shown path up to the reply: its message and the version on screen, no other.
    expect(users(page)).to_have_count(1)
    expect(users(page).first).to_contain_text(title)
    expect(replies(page)).to_have_count(1)
    branched = reply_states(page)[0]
    assert (branched.status, branched.text) == (original[0].status, original[0].text)
    expect(page.get_by_role("group", name="Versions", exact=True)).to_have_count(0)

    _chat_link(page, title).click()
    expect(page).to_have_url(original_url)
    expect(page.get_by_role("heading", level=1)).to_have_text(title)
    expect(users(page)).to_have_count(2)
    assert reply_states(page) == original
    expect_version(replies(page).first, 2, 2)


def test_continue_a_stopped_count_appends_to_the_same_reply(page: Page) -> None:
    n = 200
    open_new_chat(page)
    _stopped_count(page, n)
    reply = replies(page).first
    run_id = reply_states(page)[0].run_id
    before = len(recorded_states(page))

    button(reply, "Continue").click()
    wait_status(page, "completed", timeout=20_000)
    assert normalized(reply_states(page)[0].text) == counted(n)
    # While it streamed: one reply element, the continued one, never a second.
    seen = [s["replies"] for s in recorded_states(page)[before:]]
    assert seen and all(len(r) == 1 and r[0]["runId"] == run_id for r in seen), seen[-3:]
    assert any(r[0]["status"] == "streaming" for r in seen), "the continuation never streamed"
    assert not recorded_violations(page), recorded_violations(page)[:3]
    expect(button(reply, "Continue")).to_have_count(0)
    expect(reply.get_by_text("Stopped", exact=True)).to_have_count(0)

    page.reload()
    expect(replies(page)).to_have_count(1)
    expect(users(page)).to_have_count(1)
    expect(reply).to_have_attribute("data-run-id", run_id or "")
    assert normalized(reply_states(page)[0].text) == counted(n)


def test_a_reply_cut_short_at_the_output_limit_can_be_continued(
    numbered_app: EndpointApp, open_page: Callable[..., Page]
) -> None:
    page = open_page(numbered_app.server)
    open_new_chat(page)
    before = len(numbered_app.endpoint.requests)
    first, then = numbered_reply(before + 1), numbered_reply(before + 2)
    cut = send_and_wait(page, f"please {CUT_SHORT_CUE}")
    reply = replies(page).first
    expect(reply).to_contain_text(first)
    expect(reply.get_by_text(CUT_SHORT_LABEL, exact=True)).to_be_visible()

    button(reply, "Continue").click()
    expect(reply).to_contain_text(then)
    wait_status(page, "completed")
    expect(replies(page)).to_have_count(1)
    expect(reply).to_have_attribute("data-run-id", cut.run_id or "")
    text = reply_states(page)[0].text or ""
    assert text.count(first) == 1 and text.index(first) < text.index(then), text
    page.reload()
    expect(replies(page)).to_have_count(1)
    assert reply_states(page)[0].text == text


def _copy(page: Page, copy: Locator) -> str:
    """Click a Copy button; returns the clipboard after it said "Copied".

    The label says "Copied" for 1.5 s, and a clipboard write can hold the browser's
    answers to the test for about as long, so the labels it shows are recorded in the
    page rather than polled.
    """
    copy.evaluate(
        """b => { const shown = window.__copyLabels = [];
                  new MutationObserver(() => shown.push(b.textContent))
                    .observe(b, {childList: true, characterData: true, subtree: true}); }"""
    )
    copy.click()
    page.wait_for_function("() => window.__copyLabels.length > 0")
    assert page.evaluate("() => window.__copyLabels[0]") == "Copied"
    clipboard: str = page.evaluate("() => navigator.clipboard.readText()")
    return clipboard


def test_copy_puts_the_reply_markdown_and_the_message_text_on_the_clipboard(
    page: Page,
) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    message = "Copy this *exactly*:\n  indented, `ticks` and <angle> brackets"
    open_new_chat(page)
    send_and_wait(page, message)

    assert _copy(page, button(users(page).first, "Copy")) == message
    # The reply's own Copy follows those of the code blocks in its text.
    copied = _copy(page, button(replies(page).first, "Copy").last)
    shown = reply_states(page)[0].text or ""
    # The Markdown source: quote markers, backticks and fences, which the page renders away.
    assert "> Copy this *exactly*:\n>   indented, `ticks` and <angle> brackets" in copied, copied
    assert "`count to 20`" in copied and "`count to 20`" not in shown
    assert "```" in copied and "```" not in shown
    assert copied.split(" You wrote:")[0] == shown.strip().split(" You wrote:")[0]

    page.reload()  # shown again by the script on a fresh page, not only after a swap
    expect(button(users(page).first, "Copy")).to_be_visible()
    expect(button(replies(page).first, "Copy").last).to_be_visible()


def test_switcher_branch_and_continue_work_without_javascript(
    app: AppServer, open_page: Callable[..., Page]
) -> None:
    n = 150
    setup = open_page(app)
    chat_url = open_new_chat(setup)
    kept = _stopped_count(setup, n)
    stopped_id = reply_states(setup)[0].run_id
    regenerate_button(replies(setup).first).click()
    expect(replies(setup).first).not_to_have_attribute("data-run-id", stopped_id or "")
    wait_status(setup, "completed", timeout=20_000)
    regenerated_id = reply_states(setup)[0].run_id
    expect(button(setup, "Copy")).to_have_count(2)  # with JavaScript: message and reply

    page = open_page(app, java_script_enabled=False)
    page.goto(chat_url)
    reply = replies(page).first
    expect_version(reply, 2, 2)
    expect(button(page, "Copy")).to_have_count(0)  # nothing to copy with, so not offered
    switch_version(reply, "Previous version", 1, 2)
    expect(reply).to_have_attribute("data-run-id", stopped_id or "")
    assert numbers(reply_states(page)[0].text) == kept
    switch_version(reply, "Next version", 2, 2)
    expect(reply).to_have_attribute("data-run-id", regenerated_id or "")
    switch_version(reply, "Previous version", 1, 2)

    # Without SSE the page reloads itself every few seconds until the reply is done.
    button(reply, "Continue").click()
    wait_status(page, "completed", timeout=20_000)
    expect(reply).to_have_attribute("data-run-id", stopped_id or "")
    assert normalized(reply_states(page)[0].text) == counted(n)
    expect(replies(page)).to_have_count(1)
    expect_version(reply, 1, 2)

    chat_page = page.url
    button(reply, "Branch").click()
    expect(page).not_to_have_url(chat_page)
    expect(page.get_by_role("heading", level=1)).to_have_text(re.compile(r"\(branch\)$"))
    expect(users(page)).to_have_count(1)
    assert normalized(reply_states(page)[0].text) == counted(n)
