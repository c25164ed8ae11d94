"""A real Chat Completions server on 127.0.0.1 that plays scripted replies.

A small Starlette app under uvicorn, in a background thread, on a port chosen
by binding port 0. ``GET /v1/models`` lists `models` (with the status
`models_status`; `models_body` instead, when set). Each chat request takes the
next scripted `Reply` and is recorded (JSON body, headers, client address) so tests can assert what the
adapter sent. Fields named in `refuse_fields` are refused like OpenAI refuses
a parameter it does not know (HTTP 400), without using up a scripted reply. A reply can stream chunks with pauses and then hold the
connection open until the client goes away, which is how the tests see a
stall and a client disconnect.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

API_KEY = "sk-test-SECRET-0123456789"


@dataclass
class Reply:
    """One scripted answer: a status, headers, then body pieces (str) and pauses (float)."""

    status: int = 200
    body: list[str | float] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "text/event-stream"})
    hold: float = 0.0  # after the body, keep the response open this long or until disconnect


@dataclass
class Received:
    body: dict[str, Any]
    headers: dict[str, str]
    client: tuple[str, int]


class ChatServer:
    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.received: list[Received] = []
        self.refuse_fields: set[str] = set()
        self.models: list[str] = []
        self.models_status = 200
        self.models_body: str | None = None  # instead of the list, as it is
        self.models_asked = 0
        self.disconnected = threading.Event()
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def reset(self) -> None:
        self.script.clear()
        self.received.clear()
        self.refuse_fields.clear()
        self.models, self.models_status, self.models_body, self.models_asked = [], 200, None, 0
        self.disconnected.clear()

    def start(self) -> None:
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the scripted chat server did not start within 10 s")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    async def _models(self, request: Request) -> Response:
        self.models_asked += 1
        if self.models_body is not None:
            return Response(self.models_body, self.models_status, media_type="application/json")
        listed = [{"id": name, "object": "model", "owned_by": "test"} for name in self.models]
        return JSONResponse({"object": "list", "data": listed}, status_code=self.models_status)

    async def _chat(self, request: Request) -> Response | _ScriptedStream:
        body = await request.json()
        self.received.append(
            Received(
                body=body,
                headers={k.lower(): v for k, v in request.headers.items()},
                client=(request.client.host, request.client.port) if request.client else ("", 0),
            )
        )
        refused = sorted(self.refuse_fields & set(body))
        if refused:
            error = {
                "message": f"Unrecognized request argument supplied: {refused[0]}",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
            return JSONResponse({"error": error}, status_code=400)
        if not self.script:
            return JSONResponse({"error": {"message": "no scripted reply left"}}, status_code=599)
        return _ScriptedStream(self.script.pop(0), self)


class _ScriptedStream:
    """A raw ASGI response, so pauses and the wait for a disconnect are exact."""

    def __init__(self, reply: Reply, server: ChatServer) -> None:
        self.reply = reply
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k.encode(), v.encode()) for k, v in self.reply.headers.items()]
        await send({"type": "http.response.start", "status": self.reply.status, "headers": headers})
        for piece in self.reply.body:
            if isinstance(piece, float):
                await asyncio.sleep(piece)
            else:
                await send(
                    {"type": "http.response.body", "body": piece.encode(), "more_body": True}
                )
        if self.reply.hold:
            try:
                message = await asyncio.wait_for(receive(), timeout=self.reply.hold)
            except TimeoutError:
                message = {}
            if message.get("type") == "http.disconnect":
                self.server.disconnected.set()
                return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n"


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
    return sse(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "test-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
    )


def usage_chunk(prompt_tokens: int, completion_tokens: int) -> str:
    return sse(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


def text_reply(*pieces: str, usage: tuple[int, int] = (10, 3)) -> Reply:
    body: list[str | float] = [chunk({"role": "assistant", "content": ""})]
    body += [chunk({"content": p}) for p in pieces]
    body += [chunk({}, "stop"), usage_chunk(*usage), sse("[DONE]")]
    return Reply(body=body)
