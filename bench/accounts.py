"""What accounts cost (SPEC §13): a sign-in, a session on every request, and a chat page
among 10,000 people with 100 chats each, beside the same page with ``--auth none``.

Run from the repository root: ``python bench/accounts.py`` (a few minutes; most of it
is building the database of a million chats). The people and their chats are written
straight into the app's own schema (its triggers fill the search index as in use);
every request then goes through the whole app in-process (httpx's ASGI transport),
middleware and all. CPU is the process's own (every thread: the database's too), per
request, median of the rounds; the client's share is the same on both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from webapp.chats.passwords import hash_password
from webapp.chats.store import ChatStore
from webapp.chats.users import EVERY_CHAT
from webapp.models import ScriptedModel
from webapp.web import create_app
from webapp.web.auth import AuthSettings

PASSWORD = "benchmark password"
HTML = {"Accept": "text/html"}
HX = {"HX-Request": "true"}


def build(db: Path, users: int, chats: int) -> str:
    """``users`` people with ``chats`` chats each; the first one's first chat has 25
    exchanges (a full page). Returns that chat's id."""
    asyncio.run(_schema(db))
    digest = hash_password(PASSWORD)  # one hash for all: each costs ~50 ms to make
    now = time.time()
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executemany(
            "INSERT INTO users (id, name, password_hash, is_admin, disabled, created_at) "
            "VALUES (?, ?, ?, 0, 0, ?)",
            ((f"u{u:07d}", f"user{u:05d}", digest, now) for u in range(users)),
        )
        conn.executemany(
            "INSERT INTO chats (id, title, created_at, updated_at, user_id) VALUES (?, ?, ?, ?, ?)",
            (
                (f"{u:08x}{c:024x}", f"chat {c} of user {u}", at, at, f"u{u:07d}")
                for u in range(users)
                for c in range(chats)
                # Everyone's newest chat first, then everyone's second ...: no two alike.
                for at in (now - c * users - u,)
            ),
        )
        target = f"{0:08x}{0:024x}"
        for turn in range(25):
            run_id = f"run{turn:04d}"
            entries = [
                {"type": "user", "text": f"question {turn}: what is {turn} squared?"},
                {"type": "assistant", "text": f"**{turn * turn}**, since {turn} × {turn}. " * 8},
            ]
            conn.execute(
                "INSERT INTO session_segments (session_id, seq, run_id, first_entry, "
                "entry_count, entries_json, meta_json) VALUES (?, ?, ?, ?, 2, ?, NULL)",
                (target, turn + 1, run_id, 2 * turn, json.dumps(entries)),
            )
            conn.execute(
                "INSERT INTO chat_runs (run_id, chat_id, parent_run_id, message_id, seq, "
                "selected) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    target,
                    f"run{turn - 1:04d}" if turn else None,
                    run_id,
                    turn + 1,
                    turn + 1,
                ),
            )
    return target


async def _schema(db: Path) -> None:
    async with ChatStore(db) as store:
        await store.recent(EVERY_CHAT, 1)


def _cpu_per_request(samples: list[float], count: int) -> float:
    return statistics.median(samples) / count * 1000


async def timed_rounds(
    request: Callable[[], Awaitable[httpx.Response]], count: int, rounds: int
) -> tuple[float, float]:
    """(CPU ms, wall ms) per request, medians of ``rounds`` rounds of ``count``."""
    for _ in range(min(count, 20)):  # warm: templates compiled, pages in the cache
        await request()
    cpu, wall = [], []
    for _ in range(rounds):
        started, ticked = time.perf_counter(), time.process_time()
        for _ in range(count):
            response = await request()
            if response.status_code not in (200, 303):
                raise RuntimeError(f"{response.status_code}: {response.text[:200]}")
        cpu.append(time.process_time() - ticked)
        wall.append(time.perf_counter() - started)
    return _cpu_per_request(cpu, count), _cpu_per_request(wall, count)


async def measure(db: Path, chat_id: str, rounds: int) -> dict[str, tuple[float, float]]:
    results: dict[str, tuple[float, float]] = {}
    for mode in ("password", "none"):
        app = create_app(db, model=ScriptedModel([]), auth=AuthSettings(mode))  # type: ignore[arg-type]
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
                if mode == "password":
                    results["sign-in (Argon2id, then a new session)"] = await timed_rounds(
                        lambda: _sign_in(http), 5, rounds
                    )
                    await _sign_in(http)
                results[f"small fragment, --auth {mode}"] = await timed_rounds(
                    lambda: http.get("/search", params={"q": ""}, headers=HX), 200, rounds
                )
                results[f"chat page, --auth {mode}"] = await timed_rounds(
                    lambda: http.get(f"/chats/{chat_id}", headers=HTML), 20, rounds
                )
    return results


async def _sign_in(http: httpx.AsyncClient) -> httpx.Response:
    return await http.post("/login", data={"name": "user00000", "password": PASSWORD})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--chats", type=int, default=100, help="chats per user")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "chat.db"
        started = time.perf_counter()
        chat_id = build(db, args.users, args.chats)
        print(
            f"built {args.users:,} users x {args.chats} chats in "
            f"{time.perf_counter() - started:.0f} s ({db.stat().st_size / 1e6:.0f} MB)"
        )
        for what, (cpu, wall) in asyncio.run(measure(db, chat_id, args.rounds)).items():
            print(f"{what:<45} {cpu:8.2f} ms CPU  {wall:8.2f} ms wall  per request")


if __name__ == "__main__":
    main()
