"""The event loop's worst stall while the server handles hostile input (issue 22).

Run from the repository root: ``python bench/loop_stall.py`` (two minutes or so;
``--only issue22`` or ``--only hostile`` runs one group of cases).

The app runs under a real uvicorn server on 127.0.0.1, in this process, with a
heartbeat task on its event loop that wakes every millisecond and keeps the
longest gap between two wakes beyond that: the time every other request (a
static file, a page, another chat's stream) would have waited. The client runs
in a thread of its own, so its work never counts as the server's. Four cases,
each one request:

- **whitespace message**: ``"x" + "\\r\\n" * 99,999`` sent to the offline model,
  until its reply is stored;
- **Markdown reply**: the first view of a chat whose reply is 100,000
  characters that Markdown renders slowly (``[`` repeated);
- **10 MB import**: a valid chat file just under the upload limit;
- **unknown run of a long chat**: the event stream of a run id that is not in a
  chat of 60,000 runs (the reply lookup behind it).

And the hostile remote parties of issue 29, each on a server of its own (a
thread of this process, never the app's loop):

- **huge model list**: an endpoint whose ``GET /models`` lists 2,000,001 ids
  (69 MB): the **Refresh** that asks for it, then the home page that offers
  them (its size is printed too);
- **trickling model list**: ``{"data": [`` then one space every 2 s, for
  ``--trickle`` seconds: the **Refresh** that waits on it;
- **20 MB MCP result**: a call of the test MCP server's ``big`` tool
  (``tests/mcp_server.py``, over stdio) answering 20 MB.

Prints, per case, the request's time and the loop's worst stall. To compare with
an older tree, copy this file into it and run it there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import uvicorn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from webapp.chats.store import ChatStore
from webapp.chats.users import EVERY_CHAT
from webapp.config import AppConfig, EndpointConfig, McpServerConfig
from webapp.models.endpoints import ModelRegistry
from webapp.web import create_app

BEAT = 0.001
LONG_CHAT_RUNS = 60_000


class Heartbeat:
    """The longest the loop went without running this task, beyond its own sleep."""

    def __init__(self) -> None:
        self.worst = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(BEAT)
            self.worst = max(self.worst, loop.time() - before - BEAT)


def chat_file(runs: int, chars: int) -> bytes:
    """A valid export of ``runs`` runs, each a message and a reply of ``chars`` characters."""
    document = {
        "format_version": 1,
        "title": "big import",
        "runs": [
            {
                "run_id": f"r{n}",
                "parent_run_id": f"r{n - 1}" if n else None,
                "message_id": f"r{n}",
                "selected": n + 1,
                "entries": [
                    {"type": "user", "text": f"question {n} " + "q" * chars},
                    {"type": "assistant", "text": f"answer {n} " + "a" * chars},
                ],
                "meta": None,
            }
            for n in range(runs)
        ],
    }
    return json.dumps(document).encode()


def write_long_chat(db: Path, runs: int) -> str:
    """A chat of ``runs`` runs written into the file before the server opens it."""
    chat_id = "c" * 32
    now = time.time()
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO chats (id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
            (chat_id, "long chat", now, now),
        )
        segments, nodes = [], []
        for n in range(runs):
            run_id = f"{n:032x}"
            entries = [{"type": "user", "text": f"q{n}"}, {"type": "assistant", "text": f"a{n}"}]
            segments.append((chat_id, n + 1, run_id, 2 * n, json.dumps(entries)))
            nodes.append((run_id, chat_id, f"{n - 1:032x}" if n else None, run_id, n + 1, n + 1))
        conn.executemany(
            "INSERT INTO session_segments (session_id, seq, run_id, first_entry, entry_count, "
            "entries_json, meta_json) VALUES (?, ?, ?, ?, 2, ?, NULL)",
            segments,
        )
        conn.executemany(
            "INSERT INTO chat_runs (run_id, chat_id, parent_run_id, message_id, seq, selected) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            nodes,
        )
    return chat_id


def new_chat(http: httpx.Client) -> str:
    response = http.post("/chats")
    if response.status_code != 303:
        raise RuntimeError(f"a new chat answered {response.status_code}")
    return response.headers["location"].rsplit("/", 1)[1]


def import_file(http: httpx.Client, data: bytes) -> str:
    response = http.post("/chats/import", files={"file": ("chat.json", data, "application/json")})
    if response.status_code != 303:
        raise RuntimeError(f"import answered {response.status_code}: {response.text[:300]}")
    return response.headers["location"].rsplit("/", 1)[1]


def wait_idle(http: httpx.Client, chat_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while 'data-status="streaming"' in http.get(f"/chats/{chat_id}").text:
        if time.monotonic() > deadline:
            raise RuntimeError(f"chat {chat_id} still streams after {timeout} s")
        time.sleep(0.05)


def case_whitespace(http: httpx.Client, newlines: int) -> Callable[[], None]:
    chat_id = new_chat(http)

    def send() -> None:
        text = "x" + "\r\n" * newlines
        response = http.post(f"/chats/{chat_id}/messages", data={"text": text})
        if response.status_code != 303:
            raise RuntimeError(f"send answered {response.status_code}")
        wait_idle(http, chat_id, timeout=600)

    return send


def case_markdown(http: httpx.Client) -> Callable[[], None]:
    document = json.loads(chat_file(1, 10))
    document["runs"][0]["entries"][1]["text"] = "[" * 100_000
    chat_id = import_file(http, json.dumps(document).encode())

    def open_chat() -> None:
        http.get(f"/chats/{chat_id}").raise_for_status()

    return open_chat


def case_import(http: httpx.Client) -> Callable[[], None]:
    data = chat_file(30_000, 60)  # 9.9 MB of small runs: under the 10 MB limit

    def send() -> None:
        import_file(http, data)

    return send


def case_unknown_run(http: httpx.Client, chat_id: str) -> Callable[[], None]:
    def look() -> None:
        response = http.get(f"/chats/{chat_id}/runs/{'f' * 32}/events")
        if response.status_code != 404:
            raise RuntimeError(f"the unknown run answered {response.status_code}")

    return look


class HostileEndpoint:
    """``GET /v1/models`` as a hostile endpoint answers it, on a thread of its own:
    ``huge`` ids at once, or (after `trickle` is set) a body that never quite ends."""

    def __init__(self, ids: int) -> None:
        listed = ",".join(f'{{"id":"model-{n:024d}"}}' for n in range(ids))
        self.huge = f'{{"object":"list","data":[{listed}]}}'.encode()
        self.trickle = 0.0  # seconds of trickling; 0: answer the huge list
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            if not self.trickle:
                head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(self.huge)}\r\n\r\n"
                conn.sendall(head.encode() + self.huge)
                return
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            conn.sendall(b'a\r\n{"data": [\r\n')
            ends = time.monotonic() + self.trickle
            while time.monotonic() < ends:
                time.sleep(2)
                conn.sendall(b"1\r\n \r\n")
            conn.sendall(b"1\r\n]\r\n1\r\n}\r\n0\r\n\r\n")


def case_refresh(
    http: httpx.Client, endpoint: HostileEndpoint, trickle: float
) -> Callable[[], None]:
    def refresh() -> None:
        endpoint.trickle = trickle
        response = http.post("/tools/models/refresh")
        if response.status_code != 303:
            raise RuntimeError(f"Refresh answered {response.status_code}")

    return refresh


def case_pages(http: httpx.Client, sizes: dict[str, int]) -> Callable[[], None]:
    chat_id = new_chat(http)

    def pages() -> None:
        for name, path in (("home page", "/"), ("chat page", f"/chats/{chat_id}")):
            response = http.get(path)
            response.raise_for_status()
            sizes[name] = len(response.content)

    return pages


def case_mcp(
    app_loop: asyncio.AbstractEventLoop, servers: object, chars: int
) -> Callable[[], None]:
    def call() -> None:
        done = asyncio.run_coroutine_threadsafe(
            servers.call("test", "big", {"chars": chars}, "c1"),  # type: ignore[attr-defined]
            app_loop,
        )
        result = done.result(timeout=300)
        print(
            f" [{'error: ' + result.output[:60] if result.is_error else f'{len(result.output):,} chars'}]",
            end="",
        )

    return call


@contextlib.asynccontextmanager
async def serving(db: Path, **kwargs: object) -> AsyncIterator[tuple[str, Heartbeat]]:
    app = create_app(db, offline_delay=0.0, **kwargs)  # type: ignore[arg-type]
    serving.app = app  # type: ignore[attr-defined]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    heartbeat = Heartbeat()
    beating = asyncio.create_task(heartbeat.run())
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", heartbeat
    finally:
        beating.cancel()
        server.should_exit = True
        await asyncio.wait_for(task, 30)


Case = tuple[str, Callable[[], Callable[[], None]]]  # its name, its set-up (gives its action)


async def measure(db: Path, newlines: int, long_chat: str) -> list[tuple[str, float, float]]:
    async with serving(db) as (base, heartbeat):
        with httpx.Client(base_url=base, timeout=900) as http:
            cases: list[Case] = [
                (f"whitespace message ({newlines:,} CRLF)", lambda: case_whitespace(http, newlines)),
                ("Markdown reply (100,000 chars)", lambda: case_markdown(http)),
                ("10 MB import", lambda: case_import(http)),
                (f"unknown run, {LONG_CHAT_RUNS:,}-run chat", lambda: case_unknown_run(http, long_chat)),
            ]  # fmt: skip
            return await run_cases(http, heartbeat, cases)


async def run_cases(
    http: httpx.Client, heartbeat: Heartbeat, cases: list[Case]
) -> list[tuple[str, float, float]]:
    """Each case's action in a thread, timed, with the loop's worst stall meanwhile."""
    # Templates compile on their first use: not a stall any request pays twice.
    await asyncio.to_thread(lambda: http.get(f"/chats/{new_chat(http)}"))
    results = []
    for name, prepare in cases:
        action = await asyncio.to_thread(prepare)
        await asyncio.sleep(0.2)  # the set-up's own work is over
        print(f"{name} ...", end="", flush=True)
        heartbeat.worst = 0.0
        start = time.perf_counter()
        await asyncio.to_thread(action)
        took = time.perf_counter() - start
        print(" done")
        results.append((name, took, heartbeat.worst))
    return results


async def measure_hostile(
    db: Path, ids: int, trickle: float, mcp_chars: int
) -> tuple[list[tuple[str, float, float]], dict[str, int]]:
    sizes: dict[str, int] = {}
    endpoint = HostileEndpoint(ids)
    endpoint.trickle = 1.0  # start-up's own question: answered at once, nothing listed
    models = ModelRegistry([EndpointConfig("hostile", f"http://127.0.0.1:{endpoint.port}/v1")])
    server = McpServerConfig(
        name="test",
        command=sys.executable,
        args=(str(ROOT / "tests" / "mcp_server.py"), str(db.parent)),
        timeout=300.0,
    )
    config = AppConfig(mcp_servers=(server,))
    async with serving(db, models=models, config=config) as (base, heartbeat):
        app = serving.app  # type: ignore[attr-defined]
        servers = app.state.web.agents.servers
        loop = asyncio.get_running_loop()
        with httpx.Client(base_url=base, timeout=900) as http:
            cases: list[Case] = [
                (f"Refresh: {ids:,} model ids", lambda: case_refresh(http, endpoint, 0.0)),
                ("home and chat pages offering them", lambda: case_pages(http, sizes)),
                (f"Refresh: /models trickling {trickle:g} s", lambda: case_refresh(http, endpoint, trickle)),
                (f"MCP result of {mcp_chars / 1e6:g} M chars", lambda: case_mcp(loop, servers, mcp_chars)),
            ]  # fmt: skip
            return await run_cases(http, heartbeat, cases), sizes


async def create_schema(db: Path) -> None:
    async with ChatStore(db) as store:
        await store.recent(EVERY_CHAT, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--newlines", type=int, default=99_999, help="CRLFs in the message")
    parser.add_argument("--ids", type=int, default=2_000_001, help="ids the endpoint lists")
    parser.add_argument("--trickle", type=float, default=60.0, help="seconds /models trickles")
    parser.add_argument("--mcp-chars", type=int, default=20_000_000, help="the MCP result's size")
    parser.add_argument("--only", choices=("issue22", "hostile"), help="one group of cases")
    args = parser.parse_args()
    results: list[tuple[str, float, float]] = []
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "chat.db"
        asyncio.run(create_schema(db))
        if args.only != "hostile":
            long_chat = write_long_chat(db, LONG_CHAT_RUNS)
            results += asyncio.run(measure(db, args.newlines, long_chat))
        if args.only != "issue22":
            hostile = Path(tmp) / "hostile.db"
            asyncio.run(create_schema(hostile))
            found, sizes = asyncio.run(
                measure_hostile(hostile, args.ids, args.trickle, args.mcp_chars)
            )
            results += found
    print(f"{'case':<38} {'request s':>10} {'worst stall ms':>15}")
    for name, took, worst in results:
        print(f"{name:<38} {took:10.2f} {worst * 1000:15.0f}")
    for name, size in sizes.items():
        print(f"{name}: {size:,} bytes")


if __name__ == "__main__":
    main()
