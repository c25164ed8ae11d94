"""Send: the message shows at once, the reply streams and completes; refusals keep the text."""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import Page, expect

from .ui import (
    REPLY,
    assert_contiguous_prefix,
    button,
    counted,
    message_box,
    normalized,
    numbers,
    open_new_chat,
    recorded_states,
    replies,
    reply_states,
    send,
    users,
    wait_status,
)


def _assert_streamed_then_completed(page: Page, n: int) -> None:
    final = wait_status(page, "completed")
    expect(final).to_have_attribute("data-run-id", re.compile(r"\S+"))
    states = reply_states(page)
    assert len(states) == 1, f"expected one reply, got {states}"
    assert normalized(states[0].text) == counted(n), f"final reply text: {states[0].text!r}"

    history: list[dict[str, Any]] = recorded_states(page)
    streaming = [s for s in history if s["replies"] and s["replies"][0]["status"] == "streaming"]
    partial = [
        s
        for s in history
        if s["replies"] and s["replies"][0]["last"] is not None and s["replies"][0]["last"] < n
    ]
    assert streaming or partial, (
        "the reply was never seen streaming (no data-status=streaming, no partial text); "
        f"states seen: {[s['replies'] for s in history][-5:]}"
    )
    # The user's message is on the page no later than the first sign of the reply.
    first_reply = next(s for s in history if s["replies"])
    assert first_reply["users"] == 1, f"user message missing when the reply appeared: {first_reply}"


def test_send_button_streams_reply_to_completion(page: Page) -> None:
    open_new_chat(page)
    send(page, "count to 30")
    expect(users(page)).to_have_count(1)
    expect(users(page).first).to_contain_text("count to 30")
    _assert_streamed_then_completed(page, 30)
    expect(message_box(page)).to_have_value("")
    # What the user saw is what the database holds.
    page.reload()
    wait_status(page, "completed")
    assert normalized(reply_states(page)[0].text) == counted(30)
    expect(users(page)).to_have_count(1)


def test_enter_sends_and_shift_enter_makes_a_new_line(page: Page) -> None:
    open_new_chat(page)
    box = message_box(page)
    box.click()
    box.press_sequentially("count")
    box.press("Shift+Enter")
    expect(box).to_have_value("count\n")
    expect(users(page)).to_have_count(0)
    box.fill("count to 30")
    box.press("Enter")
    expect(users(page)).to_have_count(1)
    expect(users(page).first).to_contain_text("count to 30")
    _assert_streamed_then_completed(page, 30)


def test_second_send_during_a_run_is_refused_and_keeps_the_text(page: Page) -> None:
    open_new_chat(page)
    send(page, "count to 300")
    wait_status(page, "streaming")
    send(page, "a message sent too early")
    alert = page.get_by_role("alert").filter(has_text=re.compile(r"running|409", re.IGNORECASE))
    expect(alert).to_be_visible()
    expect(message_box(page)).to_have_value("a message sent too early")
    expect(button(page, "Send")).to_be_enabled()
    wait_status(page, "completed", timeout=20_000)
    expect(users(page)).to_have_count(1)
    expect(replies(page)).to_have_count(1)
    page.reload()
    wait_status(page, "completed")
    expect(users(page)).to_have_count(1)
    expect(users(page).filter(has_text="a message sent too early")).to_have_count(0)
    assert normalized(reply_states(page)[0].text) == counted(300)


def test_double_click_on_send_starts_one_run(page: Page) -> None:
    open_new_chat(page)
    message_box(page).fill("count to 20")
    button(page, "Send").dblclick()
    wait_status(page, "completed")
    page.reload()
    wait_status(page, "completed")
    expect(users(page)).to_have_count(1)
    expect(page.locator(REPLY)).to_have_count(1)
    nums = numbers(reply_states(page)[0].text)
    assert_contiguous_prefix(nums, "reply after a double-click")
    assert nums[-1] == 20


def test_refusal_alert_clears_when_the_run_ends_and_the_kept_text_can_be_sent(
    page: Page,
) -> None:
    """Regression: the 409 alert kept saying "a reply is still running" after Stop."""
    open_new_chat(page)
    send(page, "count to 2000")
    wait_status(page, "streaming")
    send(page, "the kept message")
    busy = page.get_by_role("alert").filter(has_text=re.compile(r"running|409", re.IGNORECASE))
    expect(busy).to_be_visible()
    button(page, "Stop").click()
    wait_status(page, "stopped")
    expect(busy).to_have_count(0)
    # The text the refusal kept is sent with one more press.
    expect(message_box(page)).to_have_value("the kept message")
    button(page, "Send").click()
    expect(users(page)).to_have_count(2)
    expect(users(page).last).to_contain_text("the kept message")
    wait_status(page, "completed")
    expect(message_box(page)).to_have_value("")
