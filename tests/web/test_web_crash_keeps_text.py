"""kill -9 mid-reply against a real endpoint: the reply goes on from the saved text (SPEC §6).

The app runs as a real ``python -m webapp`` process against a Chat Completions
server that records every request (tests/models/chat_server.py). A follower
reads the reply's event stream as a browser does, reconnecting with
``Last-Event-ID`` through the crash and the restart.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from following import Follower, most_words_gone_back
from webhelpers import HX, cli_env, free_port, parse_html, replies, stop_process, wait_serving

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))  # the endpoint's own tests' server
from chat_server import API_KEY, ChatServer, Reply, chunk, sse, usage_chunk

from webapp.models.chat_request import CONTINUE_INSTRUCTION

WORDS = [f"w{i} " for i in range(1, 301)]
PAUSE = 0.01  # between the endpoint's words: 250 ms of text is 25 words
# Up to 250 ms of text may go (SPEC §6); the rest of the margin is for a loaded machine.
MAX_WORDS_BACK = 40


def streamed(words: list[str], pause: float = PAUSE) -> Reply:
    body: list[str | float] = [chunk({"role": "assistant", "content": ""})]
    for word in words:
        body += [pause, chunk({"content": word})]
    body += [chunk({}, "stop"), usage_chunk(10, len(words)), sse("[DONE]")]
    return Reply(body=body)


@pytest.fixture
def endpoint() -> Iterator[ChatServer]:
    server = ChatServer()
    server.start()
    yield server
    server.stop()


@contextmanager
def app_process(db: Path, port: int, endpoint: ChatServer, log: Path) -> Iterator[subprocess.Popen]:
    command = [sys.executable, "-m", "webapp", "--port", str(port), "--db", str(db)]
    command += ["--base-url", endpoint.base_url, "--model", "test-model", "--api-key", API_KEY]
    with log.open("ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=cli_env())
    try:
        wait_serving(f"http://127.0.0.1:{port}", proc, log)
        yield proc
    finally:
        stop_process(proc)


def saved_text(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT text FROM checkpoint_partials ORDER BY turn, idx").fetchall()
    return "".join(r[0] for r in rows)


@pytest.mark.parametrize("continuation", ["prefill", "ask"])
async def test_kill_9_mid_reply_continues_the_saved_text(
    tmp_path: Path, endpoint: ChatServer, continuation: str
):
    db, port, log = tmp_path / "chat.db", free_port(), tmp_path / "server.log"
    base = f"http://127.0.0.1:{port}"
    if continuation == "ask":  # an endpoint without prefill: OpenAI's answer to it
        endpoint.refuse_fields = {"continue_final_message"}
    endpoint.script.append(streamed(WORDS))
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        with app_process(db, port, endpoint, log) as proc:
            chat_id = (await http.post("/chats")).headers["location"].rsplit("/", 1)[1]
            sent = await http.post(f"/chats/{chat_id}/messages", data={"text": "hi"}, headers=HX)
            follower = Follower.of_send(http, base, sent.text)
            following = asyncio.create_task(follower.follow(timeout=90))
            while follower.words_seen() < 100:
                assert not following.done(), following
                await asyncio.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=5)
        seen = follower.text
        saved = saved_text(db)
        assert saved and seen.startswith(saved)
        assert len(seen.split()) - len(saved.split()) <= MAX_WORDS_BACK
        # The endpoint is asked to go on from the saved text, and does.
        rest = "".join(WORDS)[len(saved) :]
        endpoint.script.append(streamed(re.findall(r"\S+\s*", rest)))
        asks = len(endpoint.received)
        with app_process(db, port, endpoint, log):
            await following
            page = parse_html((await http.get(f"/chats/{chat_id}")).text)
            exported = (await http.get(f"/chats/{chat_id}/export.json")).json()

    final = "".join(WORDS)
    assert follower.text.split() == final.split()
    assert follower.resets >= 1  # it saw the resumed reply streaming
    (reply,) = replies(page)
    assert reply.find(class_="content").text().split() == final.split()  # saved once, then more
    assert most_words_gone_back(follower.shown) <= MAX_WORDS_BACK
    assert all(final.startswith(shown.strip()) for shown in follower.shown if shown.strip())
    resumed = endpoint.received[asks:]
    if continuation == "prefill":
        (request,) = resumed
        assert request.body["messages"][-1] == {"role": "assistant", "content": saved}
        assert request.body["continue_final_message"] is True
    else:  # refused, then asked
        refused, request = resumed
        assert refused.body["messages"][-1] == {"role": "assistant", "content": saved}
        assert request.body["messages"][-2:] == [
            {"role": "assistant", "content": saved},
            {"role": "user", "content": CONTINUE_INSTRUCTION},
        ]
        assert "continue_final_message" not in request.body
    # the session and an export hold one reply: the saved text once, then the rest
    (run,) = exported["runs"]
    assert [e["type"] for e in run["entries"]] == ["user", "assistant"]
    assert run["entries"][1]["text"].split() == final.split()
    with sqlite3.connect(db) as conn:
        (entries,) = conn.execute("SELECT entries_json FROM session_segments").fetchone()
    assert entries.count('"assistant"') == 1 and final.replace(" ", "") in entries.replace(" ", "")
