"""Real processes and servers the browser tests drive: the app and a fake model endpoint.

The app always runs as a subprocess (`python -m webapp`) so that a test can kill it
with SIGKILL exactly as a crash would, and restart it on the same database file.
The fake OpenAI-compatible endpoint runs in-process under uvicorn in a thread; it
records every request so a test can prove the app really called it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

REPO_ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT = 20.0
STOP_TIMEOUT = 8.0

# Variables that would silently point the app at a real model or another database.
_LEAKY_ENV = (
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "WEBAPP_MODEL",
    "WEBAPP_DB",
    "WEBAPP_TOKEN",
    "WEBAPP_CONFIG",
    "WEBAPP_AUTH",  # a test that wants accounts says so on the command line
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class AppServer:
    """One `python -m webapp` subprocess; start/stop/kill can be repeated on the same db."""

    port: int
    db: Path
    log_path: Path
    offline_delay: float = 0.01
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "webapp",
            "--port",
            str(self.port),
            "--db",
            str(self.db),
            "--offline-delay",
            str(self.offline_delay),
            *self.extra_args,
        ]

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"server on port {self.port} is already running; stop it first")
        env = {k: v for k, v in os.environ.items() if k not in _LEAKY_ENV}
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start: {' '.join(self.command())}\n".encode())
            self.proc = subprocess.Popen(
                self.command(), cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_until_ready()

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(
                    f"the app exited with code {code} before answering:\n{self.log()}"
                )
            try:
                httpx.get(self.base_url + "/", timeout=1.0)
                return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(
            f"the app did not answer on {self.base_url} within {START_TIMEOUT} s:\n{self.log()}"
        )

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within STOP_TIMEOUT."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._append_log(f"=== did not exit {STOP_TIMEOUT} s after SIGTERM; SIGKILL\n")
            self.kill()

    def kill(self) -> None:
        """SIGKILL: what a crash or an OOM kill looks like to the app."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.kill()
        self.proc.wait(timeout=STOP_TIMEOUT)
        self._append_log("=== killed with SIGKILL\n")

    def _append_log(self, line: str) -> None:
        with self.log_path.open("ab") as log:
            log.write(line.encode())

    def log(self, last_lines: int = 200) -> str:
        if not self.log_path.exists():
            return "(no server log)"
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-last_lines:])


AppFactory = Callable[..., AppServer]
"""start_app(*extra_args, offline_delay=0.01) -> a started AppServer (fixture start_app)."""

HOSTILE_CHUNKS = [
    "Careful: <script>window.__pwned=1</script> ",
    'then <img src=x onerror="window.__pwned=1"> ',
    "and [click](javascript:window.__pwned=1) ",
    "and <b>raw bold</b> end.",
]
HOSTILE_DELTAS: list[dict[str, str]] = [{"content": text} for text in HOSTILE_CHUNKS]
REASONING_TEXT = "First I weigh the options, then I pick forty-two."
ANSWER_TEXT = "The answer is 42."
REASONING_DELTAS: list[dict[str, str]] = [
    {"reasoning_content": "First I weigh the options, "},
    {"reasoning_content": "then I pick forty-two."},
    {"content": "The answer "},
    {"content": "is 42."},
]
PROVIDER_ERROR = "the fake provider is on fire (quota exhausted)"
# "numbered" mode: every answer names the request it answers, so each version of a
# reply has a text of its own; a message containing CUT_SHORT_CUE ends at the output limit.
CUT_SHORT_CUE = "stop short"
# "tools" mode: a user message "call TOOL {json arguments}" is answered with that one tool
# call; the tool's result with TOOL_ANSWER and the result's first line.
TOOL_ANSWER = "The tool answered:"


def numbered_reply(n: int) -> str:
    """The text the "numbered" fake endpoint streams for its n-th request (from 1)."""
    return f"This is fake reply #{n}."


@dataclass
class FakeEndpoint:
    """An OpenAI-compatible Chat Completions endpoint on loopback with one behaviour."""

    # "error": HTTP 500 with a JSON body; "hostile": streams hostile markup;
    # "reasoning": streams reasoning_content deltas, then the answer;
    # "numbered": streams numbered_reply(n) for the n-th request (see CUT_SHORT_CUE);
    # "tools": calls the tool a user message names (see TOOL_ANSWER).
    mode: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        if self.mode == "error":
            error = {"message": PROVIDER_ERROR, "type": "server_error", "code": "fire"}
            # Retry-After: 0 lets the client's retries (if any) run without backoff.
            return JSONResponse({"error": error}, status_code=500, headers={"Retry-After": "0"})
        finish_reason = "stop"
        if self.mode == "numbered":
            words = numbered_reply(len(self.requests)).split(" ")
            deltas = [{"content": w if i == 0 else " " + w} for i, w in enumerate(words)]
            if CUT_SHORT_CUE in _last_user_text(body):
                finish_reason = "length"
        elif self.mode == "tools":
            deltas, finish_reason = _tool_turn(body, len(self.requests))
        elif self.mode == "reasoning":
            deltas = REASONING_DELTAS
        else:
            deltas = HOSTILE_DELTAS
        stream = _completion_stream(deltas, finish_reason)
        return StreamingResponse(stream, media_type="text/event-stream")

    def routes(self) -> list[Route]:
        return [Route("/v1/chat/completions", self._completions, methods=["POST"])]

    def start(self) -> None:
        """Serve on `port` (0: a free one, chosen now)."""
        app = Starlette(routes=self.routes())
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake model endpoint did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=STOP_TIMEOUT)


def _tool_turn(body: dict[str, Any], n: int) -> tuple[list[dict[str, Any]], str]:
    """The "tools" mode's answer: (deltas, finish reason) for the request's last message."""
    messages = body.get("messages", [])
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        first_line = str(last.get("content") or "").splitlines()[0:1] or [""]
        return [{"content": f"{TOOL_ANSWER} {first_line[0][:200]}"}], "stop"
    text = str(last.get("content") or "")
    if not text.startswith("call "):
        return [{"content": "Say: call TOOL {arguments}."}], "stop"
    name, _, arguments = text.removeprefix("call ").partition(" ")
    call = {
        "index": 0,
        "id": f"call_fake_{n}",
        "type": "function",
        "function": {"name": name, "arguments": arguments.strip() or "{}"},
    }
    return [{"tool_calls": [call]}], "tool_calls"


def _last_user_text(body: dict[str, Any]) -> str:
    """The last user message of a Chat Completions request, as one string."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return json.dumps(users[-1].get("content")) if users else ""


async def _completion_stream(
    deltas: list[dict[str, Any]], finish_reason: str = "stop"
) -> AsyncIterator[bytes]:
    """Chat Completions SSE: a role chunk, one chunk per delta, a finish chunk, [DONE]."""
    base = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "test",
    }
    opening: dict[str, Any] = {"role": "assistant", "content": ""}
    for delta in [opening, *deltas]:
        chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]}
    yield f"data: {json.dumps(last)}\n\n".encode()
    yield b"data: [DONE]\n\n"


@dataclass
class ModelsEndpoint(FakeEndpoint):
    """An endpoint with models of its own: ``GET /v1/models`` lists `models`, and each
    completion streams "NAME/MODEL reply #n." (n counts this endpoint's requests), then
    the usage it reports, also kept in `reported` as (prompt, completion) tokens."""

    mode: str = "models"
    name: str = ""
    models: list[str] = field(default_factory=list)
    reported: list[tuple[int, int]] = field(default_factory=list)
    chunk_delay: float = 0.0

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ]

    def reply_text(self, n: int, model: str) -> str:
        return f"{self.name}/{model} reply #{n}."

    async def _models(self, request: Request) -> Response:
        listed = [{"id": m, "object": "model", "owned_by": self.name} for m in self.models]
        return JSONResponse({"object": "list", "data": listed})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        n = len(self.requests)
        words = self.reply_text(n, str(body.get("model"))).split(" ")
        # Numbers no estimate would make: what the page shows must be these.
        usage = (1000 * len(self.name) + 17 * n, 3 * len(words) + n)
        self.reported.append(usage)
        deltas = [{"content": w if i == 0 else " " + w} for i, w in enumerate(words)]
        stream = _usage_stream(deltas, usage, str(body.get("model")), self.chunk_delay)
        return StreamingResponse(stream, media_type="text/event-stream")


async def _usage_stream(
    deltas: list[dict[str, str]], usage: tuple[int, int], model: str, delay: float
) -> AsyncIterator[bytes]:
    """Chat Completions SSE with the usage chunk ``stream_options.include_usage`` asks for."""
    async for piece in _completion_stream(deltas):
        if piece == b"data: [DONE]\n\n":
            prompt, completion = usage
            counts = {"prompt_tokens": prompt, "completion_tokens": completion}
            chunk = {"object": "chat.completion.chunk", "model": model, "choices": []}
            chunk["usage"] = {**counts, "total_tokens": prompt + completion}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        elif delay:
            await asyncio.sleep(delay)
        yield piece


MCP_SERVER = REPO_ROOT / "tests" / "mcp_server.py"
FILESYSTEM_SERVER = (
    REPO_ROOT / "tests" / "mcp_servers" / "node_modules" / ".bin" / "mcp-server-filesystem"
)


def write_tools_config(directory: Path, *, broken: bool = False) -> Path:
    """A config file (--config) with tests/mcp_server.py as server ``test`` (its traces in
    ``directory``), the reference filesystem server as ``files`` (on ``directory``/share)
    and, with ``broken``, a server ``broken`` whose command does not exist."""
    share = directory / "share"
    share.mkdir(exist_ok=True)
    servers: dict[str, dict[str, Any]] = {
        "test": {"command": sys.executable, "args": [str(MCP_SERVER), str(directory)]},
        "files": {"command": str(FILESYSTEM_SERVER), "args": [str(share)]},
    }
    if broken:
        servers["broken"] = {"command": str(directory / "no-such-server")}
    lines = []
    for name, table in servers.items():
        lines.append(f"[mcp_servers.{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
    path = directory / "webapp.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def tools_args(endpoint: FakeEndpoint, config: Path) -> list[str]:
    """The app's flags for a "tools" fake endpoint and a config file."""
    return ["--base-url", endpoint.base_url, "--model", "test", "--config", str(config)]


@dataclass(frozen=True)
class EndpointApp:
    """An app whose model is a fake endpoint: a test reads what the model was sent."""

    server: AppServer
    endpoint: FakeEndpoint
