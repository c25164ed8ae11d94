"""kill -9 of one of two app processes on PostgreSQL with 40 replies streaming (issue 35).

Run from the repository root: ``python bench/takeover.py`` (about a minute).
It starts a throwaway PostgreSQL server (or uses the database of a
``postgresql://`` URL given as the first argument, in a schema of its own) and
two ``python -m webapp`` processes A and B with the offline model. ``--chats``
chats start a long count on A; a page on B follows each reply's event stream
as EventSource does (reconnecting with ``Last-Event-ID``). Once every page
shows some of its reply, A is killed with SIGKILL. Printed, never asserted:

- the takeover: from the kill to each run's resumption on B (the resumed
  attempt's first record in ``run_events``, by the database's clock, which is
  this machine's): first, p50 and last of the runs;
- how soon B's pages showed each resumed run after its resumption;
- the most text a page ever lost at the crash, in numbers (the offline model
  writes one every ``--delay`` seconds, so 250 ms of text is 0.25/delay of them).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import httpx

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests" / "web"))

from cluster import Schemas, new_chat, running  # bench/cluster.py
from following import Follower, most_words_gone_back  # tests/web/following.py

HX = {"HX-Request": "true"}


async def start_reply(http: httpx.AsyncClient, base: str, count: int) -> str:
    """Start a count on a new chat of ``base``; returns the send's answer (its HTML)."""
    chat_id = await new_chat(http, base)
    sent = await http.post(
        f"{base}/chats/{chat_id}/messages", data={"text": f"count to {count}"}, headers=HX
    )
    if sent.status_code != 200 or "sse-connect" not in sent.text:
        raise RuntimeError(f"no live reply: {sent.status_code} {sent.text[:300]}")
    return sent.text


async def takeover(dsn: str, logs: Path, args: argparse.Namespace) -> None:
    with running(dsn, 2, args.delay, logs) as (a, b):
        limits = httpx.Limits(max_connections=4 * args.chats + 10)
        async with httpx.AsyncClient(timeout=30, limits=limits) as http:
            answers = [await start_reply(http, a.base, args.count) for _ in range(args.chats)]
            # pages on B, showing what the send's answer showed on A
            followers = [Follower.of_send(http, a.base, answer) for answer in answers]
            for follower in followers:
                follower.url = b.base + follower.url.removeprefix(a.base)
            paths = [f.url.removeprefix(b.base) for f in followers]
            tasks = [asyncio.create_task(f.follow(args.timeout)) for f in followers]
            while min(f.words_seen() for f in followers) < 20:
                await asyncio.sleep(0.05)
            assert a.proc is not None
            a.proc.kill()
            a.proc.wait(10)
            killed_at = time.time()
            shown_at_kill = [f.words_seen() for f in followers]
            saved_at_kill = await saved_words(dsn, paths)
            deadline = time.monotonic() + args.timeout
            while not all(any(t > killed_at for t in f.reset_at) for f in followers):
                if time.monotonic() > deadline:
                    raise RuntimeError("not every page showed the resumed run in time")
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # the resumed replies go on a little
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    run_ids = [p.split("/runs/")[1].split("/")[0] for p in paths]
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT run_id, extract(epoch FROM max(written_at)) FROM run_events "
            "WHERE seq = 0 AND run_id = ANY($1::text[]) GROUP BY run_id",
            run_ids,
        )
    finally:
        await conn.close()
    resumed = {r[0]: float(r[1]) for r in rows}
    took = sorted(resumed[r] - killed_at for r in run_ids)
    shown = [
        min(t for t in f.reset_at if t >= resumed[r]) - resumed[r]
        for f, r in zip(followers, run_ids, strict=True)
    ]
    back = [most_words_gone_back(after(f, killed_at)) for f in followers]
    before = [
        most_words_gone_back(f.shown[: len(f.shown) - len(after(f, killed_at)) + 1])
        for f in followers
    ]
    expected = " ".join(str(n) for n in range(1, args.count + 1))
    wrong = [f for f in followers if not expected.startswith(" ".join(f.text.split()))]
    print(
        f"{args.chats} replies streaming on A ({1 / args.delay:.0f} numbers/s each), "
        f"A killed with SIGKILL; B's pages follow them:"
    )
    print(
        f"  kill -9 -> resumed on B: first {took[0]:.1f} s, p50 {statistics.median(took):.1f} s, "
        f"last {took[-1]:.1f} s"
    )
    print(
        f"  resumed -> shown on B's page: p50 {1000 * statistics.median(shown):.0f} ms, "
        f"max {1000 * max(shown):.0f} ms"
    )
    print(
        f"  text a page lost at the crash: max {max(back)} numbers "
        f"({1000 * max(back) * args.delay:.0f} ms of text), p50 {statistics.median(back):.0f}"
    )
    print(f"  pages showing anything but the count so far: {len(wrong)}")
    ahead = sorted(s - v for s, v in zip(shown_at_kill, saved_at_kill, strict=True))
    print(
        f"  shown on a page but not yet saved at the kill: p50 {ahead[len(ahead) // 2]}, "
        f"max {ahead[-1]} numbers"
    )
    print(f"  (before the kill, for comparison: a page went back at most {max(before)} numbers)")


async def saved_words(dsn: str, paths: list[str]) -> list[int]:
    """How many numbers of each reply its saved pieces hold."""
    conn = await asyncpg.connect(dsn)
    try:
        found = []
        for path in paths:
            rows = await conn.fetch(
                "SELECT text FROM checkpoint_partials WHERE run_id = $1 ORDER BY turn, idx",
                path.split("/runs/")[1].split("/")[0],
            )
            found.append(len("".join(r[0] for r in rows).split()))
        return found
    finally:
        await conn.close()


def after(follower: Follower, moment: float) -> list[str]:
    """What the page showed from its last state before ``moment`` on."""
    first = next((i for i, t in enumerate(follower.shown_at) if t > moment), len(follower.shown))
    return follower.shown[max(0, first - 1) :]


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with Schemas(args.dsn) as schemas:
            for _ in range(args.repeat):
                await takeover(await schemas.new(), Path(tmp), args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dsn", nargs="?", help="postgresql:// URL (default: a throwaway server)")
    parser.add_argument("--chats", type=int, default=40)
    parser.add_argument("--count", type=int, default=2000, help="each reply counts to this")
    parser.add_argument("--delay", type=float, default=0.02, help="seconds between numbers")
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
