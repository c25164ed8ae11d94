"""Memory a finished chat holds in the server process, with no page open (issue 29).

Run from the repository root: ``python bench/memory.py`` (a minute or two).

The app runs in this process on a SQLite file (the offline model answering at
once), driven in-process through httpx's ASGI transport: no browser, no event
stream, so no page is open on any chat. It reads the process's resident set
size (RSS, /proc/self/statm) and the Python objects alive (tracemalloc) after a
warm-up, after 100 and after 1,000 chats each with one finished reply, and
after 200 more sends in one chat; it prints each reading and the growth per
chat (100 to 1,000) and per send. RSS also counts what the C side keeps
(SQLite's page caches, the allocator's free lists), which is noisy; the
Python figure is what the app itself holds. Where the tree has them, a finished
run's live state is let go after 0.2 s instead of 10 s (the bench waits a
second before each reading), so the figure is what a chat keeps, not the grace.
To compare with an older tree, copy this file into it and run it there.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import tracemalloc
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from webapp.chats.users import EVERY_CHAT
from webapp.web import create_app

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """The process's resident set size in bytes, after a full collection."""
    gc.collect()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def reading() -> tuple[int, int]:
    """(RSS, bytes of Python objects alive): the second leaves out what the C libraries
    (SQLite's page caches, the allocator's free lists) hold."""
    size = rss()
    return size, tracemalloc.get_traced_memory()[0]


async def wait_idle(web: object, chat_id: str) -> None:
    store = web.store  # type: ignore[attr-defined]
    for _ in range(2000):
        chat = await store.get(EVERY_CHAT, chat_id)
        if chat is None or chat.active_run_id is None:
            return
        await asyncio.sleep(0.005)
    raise RuntimeError(f"chat {chat_id} did not finish its reply")


async def new_chat_with_reply(http: httpx.AsyncClient, web: object, text: str) -> str:
    response = await http.post("/chats", data={"text": text})
    if response.status_code != 303:
        raise RuntimeError(f"a new chat answered {response.status_code}")
    chat_id = response.headers["location"].rsplit("/", 1)[1]
    await wait_idle(web, chat_id)
    return chat_id


async def measure(db: Path, chats: int, sends: int) -> list[tuple[str, tuple[int, int]]]:
    app = create_app(db, offline_delay=0.0)
    web = app.state.web
    readers = getattr(web.runs, "readers", None)
    if readers is not None:
        readers.linger = 0.2
    readings: list[tuple[str, tuple[int, int]]] = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            for n in range(20):  # warm-up: templates, caches, connections
                await new_chat_with_reply(http, web, f"warm up {n}")
            await asyncio.sleep(1)
            readings.append(("after warm-up (20 chats)", reading()))
            made = 0
            for target in (100, chats):
                while made < target:
                    made += 1
                    await new_chat_with_reply(http, web, f"hello number {made}, how are you?")
                await asyncio.sleep(1)
                readings.append((f"after {target:,} more chats", reading()))
            chat_id = await new_chat_with_reply(http, web, "one chat, many sends")
            await asyncio.sleep(1)
            before = reading()
            for n in range(sends):
                sent = await http.post(f"/chats/{chat_id}/messages", data={"text": f"again {n}"})
                if sent.status_code != 303:
                    raise RuntimeError(f"a send answered {sent.status_code}")
                await wait_idle(web, chat_id)
            await asyncio.sleep(1)
            readings.append((f"one chat, before {sends} sends", before))
            readings.append((f"one chat, after {sends} sends", reading()))
    return readings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=1000)
    parser.add_argument("--sends", type=int, default=200)
    args = parser.parse_args()
    tracemalloc.start()
    with tempfile.TemporaryDirectory() as tmp:
        readings = asyncio.run(measure(Path(tmp) / "chat.db", args.chats, args.sends))
    for name, (size, python) in readings:
        print(f"{name:<34} RSS {size / 2**20:8.1f} MiB   Python objects {python / 2**20:8.1f} MiB")
    for index, what in ((0, "RSS"), (1, "Python objects")):
        at_100, at_all = readings[1][1][index], readings[2][1][index]
        per_chat = (at_all - at_100) / (args.chats - 100)
        per_send = (readings[4][1][index] - readings[3][1][index]) / args.sends
        print(
            f"{what}: growth per chat (100 -> {args.chats:,}) {per_chat / 1024:.1f} kB, "
            f"per send in one chat {per_send / 1024:.1f} kB"
        )


if __name__ == "__main__":
    main()
