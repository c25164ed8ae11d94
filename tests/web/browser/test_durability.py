"""Runs belong to the server: a reload or a kill -9 loses nothing and repeats nothing."""

from __future__ import annotations

import time
from collections.abc import Callable

from playwright.sync_api import Page, expect

from .harness import AppFactory
from .ui import (
    assert_contiguous_prefix,
    button,
    counted,
    message_box,
    normalized,
    numbers,
    open_new_chat,
    recorded_violations,
    replies,
    reply_states,
    send,
    users,
    wait_for_numbers,
    wait_status,
)


def _sample_while_streaming(page: Page, n: int, samples: int, what: str) -> int:
    """Read the streaming reply a few times; each read must be 1..k. Returns reads taken."""
    taken = 0
    deadline = time.monotonic() + 60
    while taken < samples and time.monotonic() < deadline:
        state = reply_states(page)[-1]
        if state.status != "streaming":
            break
        nums = numbers(state.text)
        assert_contiguous_prefix(nums, f"{what} (sample {taken})")
        taken += 1
        time.sleep(0.3)  # spread the samples over the stream; bounded by `samples`
    return taken


def test_reload_mid_stream_continues_without_gap_or_repeat(page: Page) -> None:
    n = 800
    open_new_chat(page)
    send(page, f"count to {n}")
    wait_for_numbers(page, 50)
    run_id = reply_states(page)[-1].run_id
    page.reload()

    reply = wait_status(page, "streaming", timeout=5_000)
    expect(reply).to_have_attribute("data-run-id", run_id or "")
    taken = _sample_while_streaming(page, n, samples=5, what="after reload")
    assert taken >= 1, "the reply was no longer streaming right after the reload"
    wait_status(page, "completed", timeout=30_000)

    violations = recorded_violations(page)
    assert not violations, f"a gap or a duplicate was on screen after the reload: {violations[:3]}"
    states = reply_states(page)
    assert len(states) == 1 and states[0].run_id == run_id
    assert normalized(states[0].text) == counted(n)
    expect(users(page)).to_have_count(1)


def test_kill_9_mid_run_resumes_after_restart(
    start_app: AppFactory, open_page: Callable[..., Page]
) -> None:
    n = 1000  # ~10 s at 10 ms a chunk: a wide window to kill it mid-run
    server = start_app()
    page = open_page(server)
    chat_url = open_new_chat(page)
    send(page, f"count to {n}")
    seen = wait_for_numbers(page, 30)
    run_id = reply_states(page)[-1].run_id
    server.kill()
    # Nothing may have finished: the run was far from done when the process died.
    assert seen < n

    server.start()
    page.goto(chat_url)
    expect(users(page)).to_have_count(1)
    expect(replies(page)).to_have_count(1)
    reply = wait_status(page, "streaming", timeout=10_000)
    expect(reply).to_have_attribute("data-run-id", run_id or "")
    _sample_while_streaming(page, n, samples=3, what="after restart")
    wait_status(page, "completed", timeout=60_000)

    states = reply_states(page)
    assert len(states) == 1, f"expected exactly one reply after the restart, got {states}"
    nums = numbers(states[0].text)
    assert_contiguous_prefix(nums, "resumed reply")
    assert normalized(states[0].text) == counted(n)
    assert not recorded_violations(page)

    page.reload()
    expect(users(page)).to_have_count(1)
    expect(replies(page)).to_have_count(1)
    assert reply_states(page)[0].text == states[0].text
    assert page.url == chat_url


def test_send_while_the_server_is_down_shows_an_alert_and_keeps_the_text(
    start_app: AppFactory, open_page: Callable[..., Page]
) -> None:
    server = start_app()
    page = open_page(server)
    open_new_chat(page)
    server.kill()
    send(page, "are you still there?")
    expect(page.get_by_role("alert")).to_be_visible()
    expect(message_box(page)).to_have_value("are you still there?")
    expect(users(page)).to_have_count(0)

    # Back up: the kept text goes out with one more press, exactly once.
    server.start()
    button(page, "Send").click()
    expect(users(page)).to_have_count(1)
    wait_status(page, "completed")
    page.reload()
    expect(users(page)).to_have_count(1)
    expect(users(page).first).to_contain_text("are you still there?")
