"""Helpers for the web app's route tests: a tiny HTML tree, SSE parsing, polling."""

from __future__ import annotations

import asyncio
import contextlib
import html
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from webapp.chats.store import ChatStore
from webapp.chats.users import EVERY_CHAT
from webapp.stores.sqlite_session import SQLiteSession
from webapp.transcript import AssistantEntry, UserEntry
from webapp.web.app_state import WebApp

VOID = {
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
    "track", "wbr",
}  # fmt: skip


@dataclass
class Node:
    tag: str
    attrs: dict[str, str | None] = field(default_factory=dict)
    children: list[Node | str] = field(default_factory=list)
    parent: Node | None = None

    def iter(self) -> Iterator[Node]:
        for child in self.children:
            if isinstance(child, Node):
                yield child
                yield from child.iter()

    def find_all(self, tag: str | None = None, **attrs: str | bool) -> list[Node]:
        """Descendants matching ``tag`` and attributes (True: present; str: equal;
        ``class_``: one of the classes)."""
        found = []
        for node in self.iter():
            if tag is not None and node.tag != tag:
                continue
            if all(_matches(node, name, want) for name, want in attrs.items()):
                found.append(node)
        return found

    def find(self, tag: str | None = None, **attrs: str | bool) -> Node:
        found = self.find_all(tag, **attrs)
        if len(found) != 1:
            raise AssertionError(f"expected one <{tag} {attrs}>, found {len(found)}")
        return found[0]

    def text(self) -> str:
        parts: list[str] = []
        for child in self.children:
            parts.append(child if isinstance(child, str) else child.text())
        return "".join(parts)

    def norm_text(self) -> str:
        return " ".join(self.text().split())

    def closest(self, **attrs: str | bool) -> Node | None:
        node = self.parent
        while node is not None:
            if all(_matches(node, name, want) for name, want in attrs.items()):
                return node
            node = node.parent
        return None


def _matches(node: Node, name: str, want: str | bool) -> bool:
    if name == "class_":
        return str(want) in (node.attrs.get("class") or "").split()
    key = name.replace("_", "-")
    if want is True:
        return key in node.attrs
    if want is False:
        return key not in node.attrs
    return node.attrs.get(key) == want


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root")
        self.current = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, dict(attrs), parent=self.current)
        self.current.children.append(node)
        if tag not in VOID:
            self.current = node

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.current.children.append(Node(tag, dict(attrs), parent=self.current))

    def handle_endtag(self, tag: str) -> None:
        node: Node | None = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.current = node.parent

    def handle_data(self, data: str) -> None:
        self.current.children.append(data)


def parse_html(text: str) -> Node:
    builder = _TreeBuilder()
    builder.feed(text)
    builder.close()
    return builder.root


# --- the chat page, read the way a user (or a screen reader) would ---------------------


def messages(page: Node) -> list[Node]:
    """Every message element of the page, in order."""
    return [n for n in page.iter() if n.attrs.get("data-role") in ("user", "assistant")]


def replies(page: Node) -> list[Node]:
    return page.find_all(data_role="assistant")


def reply_text(reply: Node) -> str:
    return reply.find(class_="content").norm_text()


def textarea_value(page: Node, label: str) -> str:
    """The text of the textarea whose <label> says ``label``."""
    for lab in page.find_all("label"):
        if lab.norm_text() == label:
            area = page.find("textarea", id=lab.attrs["for"] or "")
            return area.text()
    raise AssertionError(f"no textarea labelled {label!r}")


def buttons(page: Node, name: str) -> list[Node]:
    return [b for b in page.find_all("button") if b.norm_text() == name]


def form_of(button: Node) -> Node:
    node = button.parent
    while node is not None and node.tag != "form":
        node = node.parent
    if node is None:
        raise AssertionError("button outside any form")
    return node


def hidden_value(page: Node, name: str) -> str:
    return page.find("input", name=name).attrs["value"] or ""


# --- SSE ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SSEvent:
    event: str
    data: str
    id: str | None


def parse_sse(body: str) -> list[SSEvent]:
    events: list[SSEvent] = []
    for block in body.replace("\r\n", "\n").split("\n\n"):
        name, data, ident = "message", [], None
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
            elif key == "id":
                ident = value
        if data:
            events.append(SSEvent(name, "\n".join(data), ident))
    return events


def text_of_fragments(events: list[SSEvent], name: str = "text") -> str:
    return "".join(parse_html(e.data).text() for e in events if e.event == name)


# --- waiting ----------------------------------------------------------------------------


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


# --- the app under test ------------------------------------------------------------

HX = {"HX-Request": "true"}


@dataclass
class WebClient:
    app: Starlette
    http: httpx.AsyncClient
    db: Path | str  # the SQLite file, or the PostgreSQL URL

    @property
    def web(self) -> WebApp:
        found: WebApp = self.app.state.web
        return found

    async def new_chat(self) -> str:
        response = await self.http.post("/chats")
        assert response.status_code == 303, response.text
        found = re.search(r"/chats/([0-9a-f]{32})$", response.headers["location"])
        assert found, response.headers["location"]
        return found.group(1)

    async def send(
        self, chat_id: str, text: str, *, client_id: str | None = None, htmx: bool = False
    ) -> httpx.Response:
        data = {"text": text}
        if client_id is not None:
            data["client_id"] = client_id
        return await self.http.post(
            f"/chats/{chat_id}/messages", data=data, headers=HX if htmx else None
        )

    async def page(self, chat_id: str) -> Node:
        response = await self.http.get(f"/chats/{chat_id}")
        assert response.status_code == 200, response.text
        return parse_html(response.text)

    async def active_run(self, chat_id: str) -> str | None:
        chat = await self.web.chats.get(EVERY_CHAT, chat_id)
        assert chat is not None
        return chat.active_run_id

    async def wait_idle(self, chat_id: str, timeout: float = 10.0) -> None:
        async def idle() -> bool:
            return await self.active_run(chat_id) is None

        await eventually(idle, timeout, f"chat {chat_id} to finish its run")

    async def wait_text(self, chat_id: str, min_chars: int, timeout: float = 10.0) -> str:
        """Wait until the live reply has streamed at least ``min_chars`` characters."""
        result = ""

        async def streamed() -> bool:
            nonlocal result
            state = self.web.runs.latest(chat_id)
            result = state.reply.text if state is not None else ""
            return len(result) >= min_chars

        await eventually(streamed, timeout, f"{min_chars} characters of reply")
        return result


MakeClient = Callable[..., Awaitable["WebClient"]]


@contextlib.asynccontextmanager
async def serve(app: Starlette) -> AsyncIterator[str]:
    """The app under a real uvicorn server on 127.0.0.1 (an ephemeral port)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())

    async def started() -> bool:
        if task.done():
            task.result()
        return server.started

    await eventually(started, 10, "uvicorn to start")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


# --- `python -m webapp` as a real process ------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
# What the CLI reads from the environment: a test's server gets none of the caller's.
CLI_SETTINGS = (
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "WEBAPP_TOKEN",
    "WEBAPP_MODEL",
    "WEBAPP_DB",
    "WEBAPP_ALLOWED_HOSTS",
    "WEBAPP_LOG_LEVEL",
    "WEBAPP_CONFIG",
    "WEBAPP_AUTH",
    "WEBAPP_AUTH_HEADER",
    "WEBAPP_TRUSTED_PROXIES",
    "WEBAPP_MAX_RUNS_PER_USER",
    "WEBAPP_MAX_TOKENS_PER_DAY",
    "WEBAPP_LOG_FORMAT",
    "WEBAPP_ACCESS_LOG",
    "WEBAPP_METRICS_TOKEN",
    "WEBAPP_DB_POOL_SIZE",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli_env(**settings: str) -> dict[str, str]:
    """The environment for `python -m webapp` from this checkout, with only ``settings``."""
    env = {k: v for k, v in os.environ.items() if k not in CLI_SETTINGS}
    return {**env, "PYTHONPATH": str(ROOT), **settings}


def wait_serving(base: str, proc: subprocess.Popen[Any], log: Path | None = None) -> None:
    """Return once the server at ``base`` answers; fail if it exits or takes 20 s."""
    deadline = time.monotonic() + 20
    while True:
        try:
            httpx.get(base + "/", timeout=2)
            return
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                output = log.read_text() if log is not None else ""
                raise AssertionError(
                    f"the server did not start ({proc.poll()})\n{output}"
                ) from None
            time.sleep(0.05)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM (a graceful shutdown), then SIGKILL if it takes over 10 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


async def read_events(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], limit: int | None
) -> list[SSEvent]:
    """Read events from a live stream; stop after ``limit`` events (then drop the connection)."""
    events: list[SSEvent] = []
    buffer = ""
    async with http.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200
        async for chunk in response.aiter_text():
            buffer += chunk
            while "\n\n" in buffer.replace("\r\n", "\n"):
                normal = buffer.replace("\r\n", "\n")
                block, buffer = normal.split("\n\n", 1)
                events.extend(parse_sse(block + "\n\n"))
                if limit is not None and len(events) >= limit:
                    return events
                if events and events[-1].event == "done":
                    return events
    return events


async def write_long_chat(db: Path, title: str, runs: int) -> str:
    """A chat of ``runs`` runs ("question N" / "answer N", run ids run000, run001 ...)
    written straight into the SQLite file before any server opens it; returns its id."""
    store = ChatStore(db)
    chat = await store.create(EVERY_CHAT, title)
    await store.close()
    async with SQLiteSession(db, wal=True) as session:
        for n in range(runs):
            entries = [UserEntry(f"question {n}"), AssistantEntry(f"answer {n}")]
            await session.append(chat.id, entries, run_id=f"run{n:03d}")
    return chat.id


def sigterm_during_a_reply(proc: subprocess.Popen[str], base: str) -> tuple[float, float, str]:
    """Send a message, follow its reply's event stream, SIGTERM the server mid-reply.

    Returns how long after the signal the stream ended and the process exited, and
    what it wrote to stderr; the process is killed if it is still there."""
    try:
        wait_serving(base, proc)
        with httpx.Client(base_url=base, timeout=10) as http:
            chat = http.post("/chats").headers["location"]
            sent = http.post(chat + "/messages", data={"text": "hi"}, headers=HX)
            found = re.search(r'sse-connect="([^"]+)"', sent.text)
            assert found is not None, (sent.status_code, dict(sent.headers), sent.text[:300])
            with http.stream("GET", html.unescape(found.group(1))) as stream:
                assert stream.status_code == 200
                chunks = stream.iter_bytes()
                next(chunks)  # the stream is live
                signalled = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                for _ in chunks:  # the server ends the stream...
                    pass
            ended = time.monotonic() - signalled
        proc.wait(timeout=15)
        exited = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    return ended, exited, proc.stderr.read() if proc.stderr else ""


@contextlib.asynccontextmanager
async def two_processes(
    dsn: str, app_a: dict[str, Any], app_b: dict[str, Any]
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Two apps on one PostgreSQL database (``create_app`` keywords each), each served
    on loopback, and a client for each."""
    from webapp.web import create_app

    apps = [create_app(dsn, **app_a), create_app(dsn, **app_b)]
    async with (
        serve(apps[0]) as base_a,
        serve(apps[1]) as base_b,
        httpx.AsyncClient(base_url=base_a, timeout=20) as a,
        httpx.AsyncClient(base_url=base_b, timeout=20) as b,
    ):
        yield a, b


# What each SQLite schema step of the chat database added, undone: a test that needs a
# file as an older release left it takes the newer steps back, newest first.
_SQLITE_STEPS_UNDONE: dict[int, tuple[str, ...]] = {
    7: tuple(
        f"ALTER TABLE chats DROP COLUMN {c}"
        for c in ("model", "instructions", "temperature", "max_tokens")
    ),
    8: tuple(
        f"ALTER TABLE chat_runs DROP COLUMN {c}"
        for c in ("model", "tokens_in", "tokens_out", "finished_at")
    ),
    9: ("DROP TABLE tool_decisions", "DROP TABLE tool_grants", "DROP TABLE paused_runs"),
    10: (
        "DROP TABLE users",
        "DROP TABLE user_sessions",
        "DROP TABLE sign_in_failures",
        "DROP INDEX chats_by_user",
        "ALTER TABLE chats DROP COLUMN user_id",
    ),
    11: ("DROP TABLE checkpoint_partials",),
    14: (
        "DROP TABLE shares",
        "DROP TABLE share_segments",
        "DROP TABLE projects",
        "DROP TABLE project_files",
        "DROP INDEX chats_by_project",
        "ALTER TABLE chats DROP COLUMN project_id",
    ),
}


def undone(*steps: int) -> tuple[str, ...]:
    """The statements that take schema ``steps`` back, in the order given."""
    return tuple(s for step in steps for s in _SQLITE_STEPS_UNDONE[step])


def sqlite_chats_schema_as_of(conn: Any, version: int) -> None:
    """Take a chat database (a `sqlite3` connection) back to schema ``version``."""
    newest = max(_SQLITE_STEPS_UNDONE) + 1
    for step in range(newest - 1, version - 1, -1):
        for statement in _SQLITE_STEPS_UNDONE.get(step, ()):
            conn.execute(statement)
    conn.execute("UPDATE schema_versions SET version = ? WHERE name = 'webapp_chats'", (version,))
