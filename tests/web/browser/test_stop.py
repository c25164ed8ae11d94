"""Stop keeps the partial reply the user saw, marks it stopped, and survives a reload."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from .ui import (
    assert_contiguous_prefix,
    button,
    message_box,
    numbers,
    open_new_chat,
    replies,
    reply_states,
    send,
    send_and_wait,
    users,
    wait_for_numbers,
    wait_status,
)


def _assert_stopped_reply(page: Page, run_id: str | None, at_least: int) -> list[int]:
    reply = wait_status(page, "stopped")
    expect(reply).to_have_attribute("data-run-id", run_id or "")
    expect(reply.get_by_text("Stopped", exact=True)).to_be_visible()
    expect(button(page, "Stop")).to_have_count(0)
    nums = numbers(reply_states(page)[-1].text)
    assert_contiguous_prefix(nums, "stopped reply")
    assert len(nums) >= at_least, f"the stopped reply lost numbers: {len(nums)} < {at_least}"
    assert len(nums) < 2000, "the run was not stopped: it counted to the end"
    return nums


def test_stop_keeps_partial_text_and_survives_reload(page: Page) -> None:
    open_new_chat(page)
    send(page, "count to 2000")
    stop = button(page, "Stop")
    expect(stop).to_be_visible()
    seen = wait_for_numbers(page, 20)
    run_id = reply_states(page)[-1].run_id
    stop.click()

    kept = _assert_stopped_reply(page, run_id, seen)
    page.reload()
    after_reload = _assert_stopped_reply(page, run_id, seen)
    assert after_reload == kept, (
        f"reload changed the stopped reply: {len(kept)} numbers before, {len(after_reload)} after"
    )
    expect(users(page)).to_have_count(1)

    # The chat is usable again: the next message gets a normal, completed reply.
    nxt = send_and_wait(page, "count to 5")
    assert numbers(nxt.text) == [1, 2, 3, 4, 5]
    expect(replies(page)).to_have_count(2)
    assert reply_states(page)[0].status == "stopped"


def test_escape_stops_the_run(page: Page) -> None:
    open_new_chat(page)
    send(page, "count to 2000")
    seen = wait_for_numbers(page, 10)
    run_id = reply_states(page)[-1].run_id
    message_box(page).press("Escape")
    _assert_stopped_reply(page, run_id, seen)
