"""Two processes, one database: either one shows, stops and refuses the same chat's runs.

A run is executed by the process that started it (A); B follows it from the
``run_events`` table with the same event ids, stops it by asking A, and
refuses a second send while it runs, because the chat's active run is
decided in the database.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence

import httpx
from playwright.sync_api import Page, expect
from postgres import Admin

from .machinery import (
    Apps,
    Arrival,
    Background,
    LiveRun,
    Pair,
    chat_page,
    client,
    fragments_text,
    live_run,
    new_chat,
    parse_html,
    read_stream,
    shown_replies,
    shown_text,
    ui,
)

BUSY_TEXT = "A reply is still running in this chat"
RETRY_SECONDS = 1.0  # the `retry` the app's streams announce: a browser reconnects this late


def chat_id_of(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[1]


def wait_live(base_url: str, chat_id: str, timeout: float = 10.0) -> LiveRun:
    """The streaming reply as this process's chat page shows it (its stream and position)."""
    deadline = time.monotonic() + timeout
    with client(base_url) as http:
        while time.monotonic() < deadline:
            found = live_run(chat_page(http, chat_id))
            if found is not None:
                return found
            time.sleep(0.05)
    raise AssertionError(f"{base_url}: chat {chat_id} shows no streaming reply after {timeout} s")


def check_log(events: Sequence[Arrival], epoch: str, text: str, what: str) -> None:
    """A whole run's stream: ids of one epoch, strictly increasing, text then done, whole."""
    assert events, f"{what}: no events"
    positions = [e.position for e in events]
    assert {p[0] for p in positions} == {epoch}, f"{what}: ids of another attempt: {positions}"
    seqs = [p[1] for p in positions]
    assert all(x < y for x, y in itertools.pairwise(seqs)), f"{what}: ids {seqs}"
    names = [e.event.event for e in events]
    assert names[-1] == "done" and set(names[:-1]) == {"text"}, f"{what}: events {names}"
    assert fragments_text(events) == text, f"{what}: the text events do not add up to the reply"
    final = parse_html(events[-1].event.data).find(data_role="assistant")
    assert final.attrs["data-status"] == "completed", what
    assert shown_text(final) == text, f"{what}: the done event's reply differs"


def streaming_lasts(page: Page) -> list[int]:
    """The last number the streaming reply showed, at every DOM state the page went through."""
    lasts: list[int] = []
    for state in ui.recorded_states(page):
        reply = state["replies"][-1] if state["replies"] else {}
        last = reply.get("last") if reply.get("status") == "streaming" else None
        if last is not None and (not lasts or lasts[-1] != last):
            lasts.append(last)
    return lasts


def test_a_page_on_b_follows_a_reply_running_on_a(
    pair: Pair, open_page: Callable[[str], Page]
) -> None:
    a, b = pair
    n = 400  # ~4 s at 10 ms a chunk: B's page joins while it streams
    page_a = open_page(a.base_url)
    chat_id = chat_id_of(ui.open_new_chat(page_a))
    ui.send(page_a, f"count to {n}")
    reply_a = ui.wait_status(page_a, "streaming", timeout=5_000)
    run_id = reply_a.get_attribute("data-run-id") or ""

    # B's chat page names A's attempt (the epoch): the log is the same on both.
    live = wait_live(b.base_url, chat_id)
    assert f"/runs/{run_id}/" in live.stream_path
    start = f"{live.epoch}:0"
    from_a = Background(lambda: read_stream(a.base_url, live.stream_path, start))
    from_b = Background(lambda: read_stream(b.base_url, live.stream_path, start))

    def switch() -> tuple[list[Arrival], int, list[Arrival]]:
        """A dropped connection whose browser reconnects to the other process: a few
        events from A, then (after the retry interval the stream announced) the rest
        from B."""
        _, first = read_stream(a.base_url, live.stream_path, start, limit=3)
        time.sleep(RETRY_SECONDS)
        status, rest = read_stream(b.base_url, live.stream_path, first[-1].event.id)
        return first, status, rest

    switched = Background(switch)

    page_b = open_page(b.base_url)
    page_b.goto(f"/chats/{chat_id}")
    reply_b = ui.wait_status(page_b, "streaming", timeout=5_000)
    expect(reply_b).to_have_attribute("data-run-id", run_id)
    ui.wait_status(page_a, "completed", timeout=30_000)
    ui.wait_status(page_b, "completed", timeout=30_000)

    shown_a, shown_b = ui.reply_states(page_a), ui.reply_states(page_b)
    assert len(shown_a) == len(shown_b) == 1, (shown_a, shown_b)
    assert shown_b[0].run_id == shown_a[0].run_id == run_id
    assert shown_b[0].text == shown_a[0].text, "B's page ends with another text than A's"
    assert ui.normalized(shown_b[0].text) == ui.counted(n)
    for name, page in (("A", page_a), ("B", page_b)):
        violations = ui.recorded_violations(page)
        assert not violations, f"a gap or a duplicate on {name}'s page: {violations[:3]}"
    lasts = streaming_lasts(page_b)
    assert len(lasts) >= 3 and lasts == sorted(lasts) and lasts[0] < n, (
        f"B's page did not show the reply growing while it streamed: {lasts[:20]}"
    )

    # The same log over HTTP from each process: same ids, the whole text, once.
    expected = ui.counted(n)
    status_a, events_a = from_a.result()
    status_b, events_b = from_b.result()
    assert status_a == status_b == 200
    check_log(events_a, live.epoch, expected, "A's stream")
    check_log(events_b, live.epoch, expected, "B's stream")
    assert events_b[-1].event.id == events_a[-1].event.id
    texts_b = [e for e in events_b if e.event.event == "text"]
    assert events_b[-1].at - texts_b[0].at > 1.0, "B sent the reply at the end, not live"

    first, status, rest = switched.result()
    assert status == 200, f"the reconnect to B got {status}"
    check_log([*first, *rest], live.epoch, expected, "3 events from A, then B")


def test_a_reconnect_to_b_ahead_of_what_b_has_read_continues_without_a_reset(
    pair: Pair, module_apps: Apps
) -> None:
    """A client may reach B with a position B has not read yet: A sends records to its
    own clients before they are in the table (here the table is locked for a moment, as
    a slow commit would hold it). B must go on from that position once the records
    arrive, not answer with a reset to its older copy (the reply would shrink on
    screen, then grow again)."""
    a, b = pair
    n = 300
    with client(a.base_url) as http:
        chat_id = new_chat(http)
        sent = http.post(f"/chats/{chat_id}/messages", data={"text": f"count to {n}"})
        assert sent.status_code == 303, sent.text
    live = wait_live(b.base_url, chat_id)  # B follows the run from here on
    start = f"{live.epoch}:0"
    admin = Admin(module_apps.dsn)
    try:
        admin.execute("BEGIN")
        admin.execute("LOCK TABLE run_events IN ACCESS EXCLUSIVE MODE")
        _, first = read_stream(a.base_url, live.stream_path, start, limit=10)
        ahead = first[-1].event.id or ""
        reconnect = Background(lambda: read_stream(b.base_url, live.stream_path, ahead))
        time.sleep(0.5)  # B has the request while the records are not in the table
    finally:
        admin.execute("COMMIT")
        admin.close()
    status, rest = reconnect.result()
    assert status == 200, f"the reconnect to B got {status}"
    assert rest and rest[0].event.event != "reset", (
        f"B answered a position ahead of its copy ({ahead}) with a reset to its own "
        f"position {rest[0].event.id}"
    )
    check_log([*first, *rest], live.epoch, ui.counted(n), "10 events from A, then B")


def test_stop_on_b_ends_a_run_owned_by_a(pair: Pair, open_page: Callable[[str], Page]) -> None:
    a, b = pair
    n = 3000  # ~30 s: far from done when Stop is pressed
    page_a = open_page(a.base_url)
    chat_id = chat_id_of(ui.open_new_chat(page_a))
    ui.send(page_a, f"count to {n}")
    ui.wait_for_numbers(page_a, 20)
    run_id = ui.reply_states(page_a)[-1].run_id

    page_b = open_page(b.base_url)
    page_b.goto(f"/chats/{chat_id}")
    ui.wait_status(page_b, "streaming", timeout=5_000)
    ui.wait_for_numbers(page_b, 40)
    ui.button(page_b, "Stop").click()
    ui.wait_status(page_b, "stopped", timeout=15_000)
    ui.wait_status(page_a, "stopped", timeout=15_000)

    stopped_a, stopped_b = ui.reply_states(page_a)[-1], ui.reply_states(page_b)[-1]
    assert stopped_a.run_id == stopped_b.run_id == run_id
    partial = ui.normalized(stopped_b.text)
    nums = ui.numbers(partial)
    ui.assert_contiguous_prefix(nums, "the stopped reply")
    assert 40 <= len(nums) < n, f"the partial reply was not kept as shown: {len(nums)} numbers"
    assert ui.normalized(stopped_a.text) == partial, "A's page and B's show different stops"
    for page in (page_a, page_b):
        expect(ui.button(page, "Stop")).to_have_count(0)
        expect(ui.last_reply(page).get_by_text("Stopped", exact=True)).to_be_visible()

    time.sleep(1.0)  # the run really ended: nothing more arrives on either page
    assert ui.reply_states(page_a) == [stopped_a]
    assert ui.reply_states(page_b) == [stopped_b]

    for server in (a, b):  # what the database holds, read through either process
        with client(server.base_url) as http:
            shown = shown_replies(chat_page(http, chat_id))
            assert [(r.attrs["data-run-id"], r.attrs["data-status"]) for r in shown] == [
                (run_id, "stopped")
            ], server.name
            assert shown_text(shown[0]) == partial, server.name
            exported = http.get(f"/chats/{chat_id}/export.json")
            assert exported.status_code == 200, exported.text
            runs = exported.json()["runs"]
            assert [r["run_id"] for r in runs] == [run_id], server.name
            assert runs[0]["meta"]["status"] == "stopped"
            entries = runs[0]["entries"]
            assert [e["type"] for e in entries] == ["user", "assistant"], entries
            assert entries[0]["text"] == f"count to {n}"
            assert ui.normalized(entries[1]["text"]) == partial, server.name

    # The chat is idle for every process: a new send is taken.
    with client(b.base_url) as http:
        response = http.post(f"/chats/{chat_id}/messages", data={"text": "count to 3"})
        assert response.status_code == 303, response.text
    page_a.reload()
    ui.wait_status(page_a, "completed", timeout=15_000, index=1)
    assert ui.reply_states(page_a)[0] == stopped_a


def test_simultaneous_sends_through_a_and_b_start_exactly_one_run(pair: Pair) -> None:
    a, b = pair
    rounds = 20
    with client(a.base_url) as http_a, client(b.base_url) as http_b:
        https = {"A": http_a, "B": http_b}
        for http in https.values():
            http.get("/")  # a connection open to each: both posts leave at once
        for round_ in range(rounds):
            chat_id = new_chat(http_a if round_ % 2 else http_b)
            barrier = threading.Barrier(2, timeout=10)

            def post(
                who: str, chat_id: str = chat_id, barrier: threading.Barrier = barrier
            ) -> httpx.Response:
                text = f"count to 1000 (sent to {who})"
                barrier.wait()
                return https[who].post(f"/chats/{chat_id}/messages", data={"text": text})

            calls = {who: Background(lambda who=who: post(who)) for who in https}  # type: ignore[misc]
            answers = {who: call.result(timeout=20) for who, call in calls.items()}
            statuses = {who: r.status_code for who, r in answers.items()}
            assert sorted(statuses.values()) == [303, 409], f"round {round_}: {statuses}"
            winner = next(who for who, s in statuses.items() if s == 303)
            loser = "B" if winner == "A" else "A"
            assert BUSY_TEXT in answers[loser].text, answers[loser].text

            # Exactly one run, the winner's, seen the same from both processes.
            for who, http in https.items():
                page = chat_page(http, chat_id)
                users = page.find_all(data_role="user")
                assert [shown_text(u) for u in users] == [f"count to 1000 (sent to {winner})"], (
                    f"round {round_}, read through {who}"
                )
                assert len(shown_replies(page)) == 1, f"round {round_}, read through {who}"
            run_id = shown_replies(chat_page(http_a, chat_id))[0].attrs["data-run-id"]
            stopped = https[loser].post(f"/chats/{chat_id}/runs/{run_id}/stop")
            assert stopped.status_code == 303, stopped.text
            reply = shown_replies(chat_page(https[winner], chat_id))[0]
            assert reply.attrs["data-status"] == "stopped", f"round {round_}"
