"""The documented deployment: two processes on one PostgreSQL behind nginx, round-robin.

No sticky sessions: one page's requests (the page, the send, the event
stream, its reconnects) land on either process in turn. nginx is a private
one (see `machinery.Nginx`); without nginx these tests are skipped, and fail
under CI=true.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from .machinery import Apps, ClusterApp, Nginx, failed, find_nginx, ui

HANDOVER_STANDSTILL_MS = 8_000  # SPEC §9: the reply stands still no more than 8 s

Proxied = tuple[ClusterApp, ClusterApp, Nginx]


@pytest.fixture(scope="module")
def shared_proxied(module_apps: Apps) -> Proxied:
    find_nginx()  # skip (or fail under CI) before starting anything
    a, b = module_apps.pair()
    return a, b, module_apps.nginx([a, b])


@pytest.fixture
def proxied(
    shared_proxied: Proxied, module_apps: Apps, request: pytest.FixtureRequest
) -> Iterator[Proxied]:
    yield shared_proxied
    if failed(request):
        print(module_apps.logs())


def send_through(page: Page, text: str) -> str:
    """Send; returns the upstream ("127.0.0.1:PORT") nginx gave the POST, whose process
    starts the run and so executes it."""
    with page.expect_response(
        lambda r: r.request.method == "POST" and r.url.endswith("/messages")
    ) as info:
        ui.send(page, text)
    response = info.value
    assert response.status < 400, f"the send was refused: {response.status}"
    return response.headers.get("x-upstream", "")


def assert_whole_once(page: Page, run_id: str | None, n: int) -> None:
    states = ui.reply_states(page)
    assert len(states) == 1, f"expected exactly one reply, got {states}"
    assert states[0].run_id == run_id
    assert states[0].status == "completed"
    assert ui.normalized(states[0].text) == ui.counted(n)
    violations = ui.recorded_violations(page)
    assert not violations, f"a gap or a duplicate was on screen: {violations[:3]}"


def test_a_page_through_nginx_sends_streams_and_finishes(
    proxied: Proxied, open_page: Callable[[str], Page]
) -> None:
    a, b, nginx = proxied
    n = 300
    page = open_page(nginx.base_url)
    ui.open_new_chat(page)
    upstream = send_through(page, f"count to {n}")
    assert upstream in (a.address, b.address), f"X-Upstream said {upstream!r}"
    run_id = ui.wait_status(page, "streaming", timeout=5_000).get_attribute("data-run-id")
    ui.wait_status(page, "completed", timeout=30_000)
    assert_whole_once(page, run_id, n)
    streamed = [
        s["replies"][-1]["last"]
        for s in ui.recorded_states(page)
        if s["replies"] and s["replies"][-1]["status"] == "streaming"
    ]
    assert len(set(streamed)) >= 3, f"the reply did not stream: {streamed[:20]}"
    page.reload()
    assert_whole_once(page, run_id, n)
    assert nginx.upstreams_used() == {a.address, b.address}, "nginx did not balance"


def test_a_refresh_through_nginx_mid_reply_continues(
    proxied: Proxied, open_page: Callable[[str], Page]
) -> None:
    n = 800
    page = open_page(proxied[2].base_url)
    ui.open_new_chat(page)
    send_through(page, f"count to {n}")
    seen = ui.wait_for_numbers(page, 50)
    run_id = ui.reply_states(page)[-1].run_id
    for _ in range(2):  # round-robin: the two reloads are served by different processes
        page.reload()
        reply = ui.wait_status(page, "streaming", timeout=5_000)
        expect(reply).to_have_attribute("data-run-id", run_id or "")
        seen = ui.wait_for_numbers(page, seen + 30)
    ui.wait_status(page, "completed", timeout=30_000)
    assert_whole_once(page, run_id, n)


def standstills(states: list[dict[str, Any]], since_ms: float) -> tuple[float, float]:
    """(longest time the reply on screen did not change, longest time it showed no
    number beyond those shown before), in ms, from ``since_ms`` until it completed."""
    last_change = last_new = since_ms
    longest_change = longest_new = 0.0
    shown = None
    highest = 0
    for state in states:
        if state["t"] < since_ms or not state["replies"]:
            continue
        reply = state["replies"][-1]
        now = state["t"]
        current = (reply["status"], reply["length"], reply["last"])
        if current != shown:
            longest_change = max(longest_change, now - last_change)
            last_change, shown = now, current
        if (reply["last"] or 0) > highest:
            longest_new = max(longest_new, now - last_new)
            last_new, highest = now, reply["last"]
        if reply["status"] == "completed":
            return longest_change, longest_new
    raise AssertionError("the page never showed the reply completed")


def test_sigterm_of_the_owner_hands_the_run_over_and_the_reply_goes_on(
    proxied: Proxied, open_page: Callable[[str], Page]
) -> None:
    a, b, nginx = proxied
    n = 900  # ~9 s at 10 ms a chunk: most of it after the SIGTERM
    page = open_page(nginx.base_url)
    ui.open_new_chat(page)
    upstream = send_through(page, f"count to {n}")
    owner, other = (a, b) if upstream == a.address else (b, a)
    assert upstream == owner.address, f"X-Upstream said {upstream!r}"
    ui.wait_for_numbers(page, 50)
    run_id = ui.reply_states(page)[-1].run_id
    signalled_ms: float = page.evaluate("performance.now()")
    try:
        started = time.monotonic()
        owner.stop()  # SIGTERM; SIGKILL if it has not exited within 8 s
        exit_seconds = time.monotonic() - started
        # uvicorn re-raises the SIGTERM once shut down: the exit status is -15 either
        # way, so the log tells a graceful exit from the harness's SIGKILL.
        assert "did not exit" not in owner.log(), f"the owner ignored SIGTERM:\n{owner.log()}"
        assert re.search(r"handed \d+ runs over", owner.log()), "the owner did not hand over"
        ui.wait_status(page, "completed", timeout=40_000)
        assert_whole_once(page, run_id, n)
        assert re.search(rf"resuming run {run_id}", other.log()), "the other process did not"
        still, no_new = standstills(ui.recorded_states(page), signalled_ms)
        print(
            f"SIGTERM: owner exited in {exit_seconds:.1f} s; reply unchanged at most "
            f"{still / 1000:.1f} s, nothing new at most {no_new / 1000:.1f} s"
        )
        assert still <= HANDOVER_STANDSTILL_MS, f"the reply stood still {still / 1000:.1f} s"
        assert no_new <= HANDOVER_STANDSTILL_MS, (
            f"the reply showed nothing new for {no_new / 1000:.1f} s"
        )
    finally:
        owner.start()  # the module's pair whole again for whatever runs next
