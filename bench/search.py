"""Search latency over a large library: 10,000 chats of 20 messages each (SPEC §8).

Run from the repository root: ``python bench/search.py`` (about a minute; most of
it is building the database). The chats are written through the chat store's
own schema, so the search index is filled by its triggers exactly as in use;
then every query runs through `ChatStore.search`, the path the page uses.
Prints p50 and p95 per kind of query.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from webapp.chats.store import ChatStore
from webapp.chats.users import EVERY_CHAT


def _word(n: int) -> str:
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    out = ""
    n += 27
    while n:
        n, r = divmod(n, 26)
        out += letters[r]
    return out


# A Zipf-like vocabulary, as real text has: a few words in nearly every message, most
# words in few. Queries of each kind pick from their own band of it.
VOCABULARY = [_word(i) for i in range(30_000)]
CUMULATIVE = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(VOCABULARY))))


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(VOCABULARY, cum_weights=CUMULATIVE, k=words))


def build(db: Path, chats: int, turns: int, seed: int = 1) -> None:
    """``chats`` chats of ``turns`` user messages and replies each, in one transaction."""
    rng = random.Random(seed)
    asyncio.run(_create_schema(db))
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        now = time.time()
        for c in range(chats):
            chat_id = f"{c:032x}"
            conn.execute(
                "INSERT INTO chats (id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
                (chat_id, _text(rng, 3), now - c, now - c),
            )
            parent = None
            for t in range(turns):
                run_id = f"{c:016x}{t:016x}"
                entries = [
                    {"type": "user", "text": _text(rng, 12)},
                    {"type": "assistant", "text": _text(rng, 60)},
                ]
                conn.execute(
                    "INSERT INTO session_segments (session_id, seq, run_id, first_entry, "
                    "entry_count, entries_json, meta_json) VALUES (?, ?, ?, ?, 2, ?, NULL)",
                    (chat_id, t + 1, run_id, 2 * t, json.dumps(entries)),
                )
                conn.execute(
                    "INSERT INTO chat_runs (run_id, chat_id, parent_run_id, message_id, seq, "
                    "selected) VALUES (?, ?, ?, ?, ?, ?)",
                    (run_id, chat_id, parent, run_id, t + 1, t + 1),
                )
                parent = run_id


async def _create_schema(db: Path) -> None:
    async with ChatStore(db) as store:
        await store.recent(EVERY_CHAT, 1)  # opens the file: schema, triggers and index


async def measure(db: Path, rounds: int) -> dict[str, list[float]]:
    rng = random.Random(2)
    kinds = {
        "very common word": lambda: rng.choice(VOCABULARY[:10]),
        "typical word": lambda: rng.choice(VOCABULARY[100:1000]),
        "rare word": lambda: rng.choice(VOCABULARY[5000:]),
        "two typical words": lambda: " ".join(rng.sample(VOCABULARY[100:1000], 2)),
        "prefix as you type": lambda: rng.choice(VOCABULARY[100:1000])[:3],
        "no match": lambda: "zzyzx" + str(rng.randint(0, 999)),
        "hostile 5,000 chars": lambda: '"(' * 2500,
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    async with ChatStore(db) as store:
        await store.search(EVERY_CHAT, "warm up")
        for _ in range(rounds):
            for kind, make in kinds.items():
                query = make()
                start = time.perf_counter()
                await store.search(EVERY_CHAT, query)
                times[kind].append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=20, help="per chat (half are replies)")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "library.db"
        start = time.perf_counter()
        build(db, args.chats, args.messages // 2)
        built = time.perf_counter() - start
        size = db.stat().st_size / 1e6
        print(
            f"{args.chats:,} chats x {args.messages} messages: built in {built:.1f} s, "
            f"{size:.0f} MB"
        )
        times = asyncio.run(measure(db, args.rounds))
    print(f"{'query':<22} {'p50 ms':>8} {'p95 ms':>8}")
    for kind, values in times.items():
        values.sort()
        p95 = values[min(len(values) - 1, int(len(values) * 0.95))]
        print(f"{kind:<22} {statistics.median(values):8.1f} {p95:8.1f}")


if __name__ == "__main__":
    main()
