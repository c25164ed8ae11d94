"""HEAD: every GET route answers with its headers and no body, at once (the event stream too).

Read off the wire from a real uvicorn server: through httpx's ASGI transport a
HEAD response would still carry the body Starlette hands the server to drop.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from starlette.routing import Mount, Route
from webhelpers import HX, parse_html, replies, serve

from webapp.chats.users import EVERY_CHAT
from webapp.models import ScriptedModel
from webapp.web import create_app

NUMBERS = " ".join(str(i) for i in range(1, 201))
PROMPT = 5.0  # seconds: far more than any answer here takes, far less than a stream lasts


async def raw(base: str, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection (``Connection: close``): the status, the
    headers, and every byte the server sent after them until it closed."""
    port = urlsplit(base).port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        request = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        writer.write(request.encode())
        data = await asyncio.wait_for(reader.read(), PROMPT)  # until the server closes
    finally:
        writer.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, rest


async def test_head_on_a_live_runs_event_stream_answers_at_once_with_no_body(tmp_path: Path):
    app = create_app(tmp_path / "chat.db", model=ScriptedModel([NUMBERS], chunk_delay=0.05))
    async with serve(app) as base, httpx.AsyncClient(base_url=base, timeout=10) as http:
        chat_id = (await http.post("/chats")).headers["location"].rsplit("/", 1)[1]
        sent = await http.post(f"/chats/{chat_id}/messages", data={"text": "count"}, headers=HX)
        url = str(replies(parse_html(sent.text))[-1].attrs["sse-connect"])
        state = app.state.web.runs.latest(chat_id)
        assert state is not None and not state.finished
        status, headers, body = await raw(base, "HEAD", url)
        assert status == 200
        assert headers["content-type"].startswith("text/event-stream")
        assert body == b""
        assert not state.finished  # answered while the run is still streaming
        # The same address still streams on GET: HEAD took nothing from it.
        async with http.stream("GET", url) as stream:
            assert stream.status_code == 200
            assert b"event: text" in await anext(stream.aiter_bytes())


async def test_every_get_route_answers_head_like_get_without_a_body(tmp_path: Path):
    app = create_app(tmp_path / "chat.db", model=ScriptedModel(["short", "short"]))
    async with serve(app) as base, httpx.AsyncClient(base_url=base, timeout=10) as http:
        chat_id = (await http.post("/chats")).headers["location"].rsplit("/", 1)[1]
        # With a file: its download is a GET route too (SPEC §14).
        note = {"files": ("note.txt", b"a note", "text/plain")}
        sent = await http.post(f"/chats/{chat_id}/messages", data={"text": "hi"}, files=note)
        assert sent.status_code < 400, sent.text

        async def finished() -> str:
            while True:
                state = app.state.web.runs.latest(chat_id)
                if state is not None and state.finished:
                    return str(state.run_id)
                await asyncio.sleep(0.02)

        run_id = await asyncio.wait_for(finished(), 10)
        page = (await http.get(f"/chats/{chat_id}")).text
        (file_id,) = set(re.findall(rf"/chats/{chat_id}/files/([0-9a-f]+)", page))
        await http.post(f"/chats/{chat_id}/share")
        link = await app.state.web.store.shares.link(EVERY_CHAT, chat_id)
        project = (await http.post("/projects", data={"name": "p"})).headers["location"]
        params = {
            "chat_id": chat_id,
            "run_id": run_id,
            "file_id": file_id,
            "token": link.token,
            "project_id": project.rsplit("/", 1)[1],
        }
        # An API run too: its event stream is a GET route of its own (SPEC §16).
        (model,) = (await http.get("/v1/models")).json()["data"]
        asked = {"model": model["id"], "messages": [{"role": "user", "content": "hi"}]}
        api_run_id = (await http.post("/v1/chat/completions", json=asked)).headers["x-run-id"]
        paths = []
        for route in app.routes:
            if isinstance(route, Mount):
                paths.append(route.path + "/app.js")  # the static files
            elif isinstance(route, Route) and route.methods and "GET" in route.methods:
                given = (
                    {**params, "run_id": api_run_id} if route.path.startswith("/v1/") else params
                )
                wanted = {name: given[name] for name in route.param_convertors}
                paths.append(app.url_path_for(route.name, **wanted))
        assert f"/chats/{chat_id}/runs/{run_id}/events" in paths
        for path in paths:
            got_status, got_headers, got_body = await raw(base, "GET", path)
            status, headers, body = await raw(base, "HEAD", path)
            assert (status, body) == (got_status, b""), path
            assert got_status == 200 and got_body, path  # GET has a body to leave out
            assert headers["content-type"] == got_headers["content-type"], path
