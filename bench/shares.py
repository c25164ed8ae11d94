"""What a shared page costs (SPEC §15): a 2,000-message chat's shared page beside its
owner's own page of it, and what Create link / Update link cost for it.

Run from the repository root: ``python bench/shares.py``. A chat of 1,000 exchanges
(2,000 messages, each reply a paragraph of Markdown) is written straight into the app's
own schema; then every request goes through the whole app in-process (httpx's ASGI
transport), middleware and all. CPU is the process's own (every thread: the database's
and the Markdown worker's too), per request, median of the rounds. Both pages show the
latest page of the chat (25 exchanges) with the way to the earlier ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from accounts import timed_rounds  # bench/accounts.py: CPU and wall ms per request

from webapp.chats.store import ChatStore
from webapp.chats.users import EVERY_CHAT
from webapp.models import ScriptedModel
from webapp.web import create_app

HTML = {"Accept": "text/html"}


def build(db: Path, exchanges: int) -> str:
    """A chat of ``exchanges`` user messages and replies; returns its id."""
    asyncio.run(_schema(db))
    chat_id = "c" * 32
    now = time.time()
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(
            "INSERT INTO chats (id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
            (chat_id, "A long chat", now, now),
        )
        for turn in range(exchanges):
            run_id = f"run{turn:05d}"
            reply = f"**{turn * turn}**, since `{turn}` × {turn}; see [the table](#t{turn}). " * 6
            entries = [
                {"type": "user", "text": f"question {turn}: what is {turn} squared?"},
                {"type": "assistant", "text": reply},
            ]
            conn.execute(
                "INSERT INTO session_segments (session_id, seq, run_id, first_entry, "
                "entry_count, entries_json, meta_json) VALUES (?, ?, ?, ?, 2, ?, NULL)",
                (chat_id, turn + 1, run_id, 2 * turn, json.dumps(entries)),
            )
            conn.execute(
                "INSERT INTO chat_runs (run_id, chat_id, parent_run_id, message_id, seq, "
                "selected) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    chat_id,
                    f"run{turn - 1:05d}" if turn else None,
                    run_id,
                    turn + 1,
                    turn + 1,
                ),
            )
    return chat_id


async def _schema(db: Path) -> None:
    async with ChatStore(db) as store:
        await store.recent(EVERY_CHAT, 1)


async def measure(db: Path, chat_id: str, rounds: int) -> dict[str, tuple[float, float]]:
    app = create_app(db, model=ScriptedModel([]))
    results: dict[str, tuple[float, float]] = {}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            results["Create link / Update link"] = await timed_rounds(
                lambda: http.post(f"/chats/{chat_id}/share"), 3, rounds
            )
            page = (await http.get(f"/chats/{chat_id}/share", headers=HTML)).text
            found = re.search(r"/s/[A-Za-z0-9_-]{43}", page)
            if found is None:
                raise RuntimeError("the share page shows no link")
            shared = found.group()
            results["owner's chat page"] = await timed_rounds(
                lambda: http.get(f"/chats/{chat_id}", headers=HTML), 20, rounds
            )
            results["shared page"] = await timed_rounds(
                lambda: http.get(shared, headers=HTML), 20, rounds
            )
            owner = await http.get(f"/chats/{chat_id}", headers=HTML)
            viewer = await http.get(shared, headers=HTML)
            for name, response in (("owner's", owner), ("shared", viewer)):
                shown = response.text.count('data-role="user"')
                print(f"{name} page shows {shown} user messages, {len(response.content):,} bytes")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exchanges", type=int, default=1_000, help="user messages (and replies)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "chat.db"
        chat_id = build(db, args.exchanges)
        print(f"a chat of {2 * args.exchanges:,} messages")
        for what, (cpu, wall) in asyncio.run(measure(db, chat_id, args.rounds)).items():
            print(f"{what:<28} {cpu:8.2f} ms CPU  {wall:8.2f} ms wall  per request")


if __name__ == "__main__":
    main()
