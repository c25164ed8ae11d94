"""kill -9 of the process running a reply: another process takes the run over and finishes it.

The dead process's lease expires (`LEASE_SECONDS` unrenewed), B claims the run, resumes it
from its checkpoint under a new epoch, and B's page, which was following the
run, gets one reset and then the rest: exactly one reply, whole, as the
offline model writes it when nothing goes wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from playwright.sync_api import Page, expect

from .machinery import Apps, chat_page, client, shown_replies, ui

TAKEOVER_SECONDS = 20.0  # lease expiry (10 s) + a scan (2 s) + the rest of the reply


def test_kill_9_of_the_owner_mid_reply_the_other_process_finishes_it(
    apps: Apps, open_page: Callable[[str], Page]
) -> None:
    a, b = apps.pair()
    n = 300  # ~3 s at 10 ms a chunk: killed long before its end
    message = f"count to {n}"
    page_a = open_page(a.base_url)
    chat_url = ui.open_new_chat(page_a)
    chat_path = "/chats/" + chat_url.rsplit("/", 1)[1]
    ui.send(page_a, message)
    ui.wait_for_numbers(page_a, 10)
    run_id = ui.reply_states(page_a)[-1].run_id or ""

    page_b = open_page(b.base_url)
    page_b.goto(chat_path)
    expect(ui.wait_status(page_b, "streaming", timeout=5_000)).to_have_attribute(
        "data-run-id", run_id
    )
    ui.wait_for_numbers(page_b, 20)
    a.kill()
    killed_at = time.monotonic()
    shown_at_kill = len(ui.numbers(ui.reply_states(page_b)[-1].text))
    assert shown_at_kill < n, "the reply was finished before the kill: nothing to take over"

    ui.wait_status(page_b, "completed", timeout=TAKEOVER_SECONDS * 1000)
    took = time.monotonic() - killed_at
    print(f"kill -9 -> finished reply on B: {took:.1f} s")
    states = ui.reply_states(page_b)
    assert len(states) == 1, f"expected exactly one reply after the takeover, got {states}"
    assert states[0].run_id == run_id
    violations = ui.recorded_violations(page_b)
    assert not violations, f"a gap or a duplicate on B's page: {violations[:3]}"
    assert f"resuming run {run_id}" in b.log(), "B did not say it resumed the run"

    # The same message answered with no kill, on the same database.
    page_ref = open_page(b.base_url)
    ui.open_new_chat(page_ref)
    reference = ui.send_and_wait(page_ref, message, timeout=15_000)
    assert states[0].text == reference.text
    assert ui.normalized(reference.text) == ui.counted(n)

    # Stored once: a page opened now (on the survivor) and the database agree.
    page_b.reload()
    expect(ui.users(page_b)).to_have_count(1)
    expect(ui.replies(page_b)).to_have_count(1)
    assert ui.reply_states(page_b) == states
    with client(b.base_url) as http:
        chat_id = chat_path.rsplit("/", 1)[1]
        shown = shown_replies(chat_page(http, chat_id))
        assert [(r.attrs["data-run-id"], r.attrs["data-status"]) for r in shown] == [
            (run_id, "completed")
        ]
        runs = http.get(f"{chat_path}/export.json").json()["runs"]
    assert [r["run_id"] for r in runs] == [run_id]
    entries = runs[0]["entries"]
    assert [e["type"] for e in entries] == ["user", "assistant"], entries
    assert entries[0]["text"] == message
    assert entries[1]["text"] == ui.counted(n)
