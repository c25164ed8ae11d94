"""kill -9 of the process running a reply, on PostgreSQL: the survivor continues its saved text.

SPEC §6 and §9: the survivor takes the run over once its lease expires and goes
on from the text saved before the crash, not from nothing; a page on the
survivor that followed the run through the crash (reconnecting with
``Last-Event-ID``, as EventSource does) never sees the reply go back by more
than 250 ms of text, and shows the resumed run within 1 s of its resumption.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import asyncpg
import httpx
from following import Follower, most_words_gone_back

from .machinery import Apps

COUNT = 400  # 10 ms a number (the apps' offline delay): 250 ms of text is 25 numbers
MAX_NUMBERS_BACK = 40  # 25, and a margin for a loaded machine
TAKEOVER_SECONDS = 60.0  # lease expiry (10 s) + a scan (2 s) + the rest, on a slow machine


def test_kill_9_of_the_owner_the_survivor_continues_the_saved_text(
    apps: Apps, postgres_dsn: str
) -> None:
    # On a thread of its own: this folder's Chromium (sync Playwright) may hold a running
    # event loop in the test's thread, where no other loop can run.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _survivor_continues(apps, postgres_dsn)).result()


async def _survivor_continues(apps: Apps, postgres_dsn: str) -> None:
    a, b = apps.pair()
    expected = [str(n) for n in range(1, COUNT + 1)]
    async with httpx.AsyncClient(timeout=10) as http:
        chat = (await http.post(a.base_url + "/chats")).headers["location"]
        sent = await http.post(
            a.base_url + chat.removeprefix(a.base_url) + "/messages",
            data={"text": f"count to {COUNT}"},
            headers={"HX-Request": "true"},
        )
        follower = Follower.of_send(http, a.base_url, sent.text)
        follower.url = b.base_url + follower.url.removeprefix(a.base_url)  # a page on B
        run_id = follower.url.split("/runs/")[1].split("/")[0]
        following = asyncio.create_task(follower.follow(TAKEOVER_SECONDS))
        while follower.words_seen() < 60:
            assert not following.done(), following
            await asyncio.sleep(0.01)
        a.kill()
        killed_at = time.time()
        seen_at_kill = follower.words_seen()
        await following

    conn = await asyncpg.connect(postgres_dsn)
    try:
        resumed_at = await conn.fetchval(
            "SELECT extract(epoch FROM max(written_at)) FROM run_events "
            "WHERE run_id = $1 AND seq = 0",
            run_id,
        )
        (entries,) = await conn.fetchrow(
            "SELECT entries_json FROM session_segments WHERE run_id = $1", run_id
        )
    finally:
        await conn.close()
    assert seen_at_kill < COUNT, "finished before the kill: nothing to take over"
    assert follower.text.split() == expected  # the saved numbers once, then the rest
    assert all(" ".join(expected).startswith(s.strip()) for s in follower.shown if s.strip())
    gone_back = most_words_gone_back(follower.shown)
    assert gone_back <= MAX_NUMBERS_BACK, gone_back
    shown_after = min(t for t in follower.reset_at if t >= float(resumed_at)) - float(resumed_at)
    print(
        f"kill -9 -> resumed on B: {float(resumed_at) - killed_at:.1f} s; "
        f"shown on B {1000 * shown_after:.0f} ms after; went back {gone_back} numbers"
    )
    assert shown_after < 1.0
    assert entries.count('"assistant"') == 1 and " ".join(expected) in entries
