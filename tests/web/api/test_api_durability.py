"""An API stream resumed where it broke off (SPEC §16): after kill -9 and a restart, and
on another process of the same PostgreSQL database -- no gap, no duplicate."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from chat_server import ChatServer, Reply, chunk, sse, usage_chunk
from conftest import MODEL, serve
from webhelpers import cli_env, free_port

PIECES = [f"word{i} " for i in range(30)]
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Count"}], "stream": True}


def slow_reply(pause: float, pieces: list[str] = PIECES) -> Reply:
    body: list[str | float] = [chunk({"role": "assistant", "content": ""})]
    for piece in pieces:
        body += [chunk({"content": piece}), pause]
    body += [chunk({}, "stop"), usage_chunk(5, 30), sse("[DONE]")]
    return Reply(body=body)


def events(text: str) -> list[tuple[str | None, str]]:
    found = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in fields:
            found.append((fields.get("id"), fields["data"]))
    return found


def content(found: list[tuple[str | None, str]]) -> str:
    return "".join(
        choice["delta"].get("content") or ""
        for _, data in found
        if data != "[DONE]"
        for choice in json.loads(data).get("choices", [])
    )


def read_some(base: str, headers: dict[str, str] | None = None) -> tuple[str, str, str]:
    """Start a stream, read until word5; (run id, what was read, its last event id)."""
    with httpx.stream(
        "POST", base + "/v1/chat/completions", json=BODY, headers=headers, timeout=30
    ) as got:
        run_id, read = got.headers["x-run-id"], ""
        for line in got.iter_lines():
            read += line + "\n"
            if "word5" in line:
                break
    last = [i for i, _ in events(read + "\n") if i is not None][-1]
    return run_id, read + "\n", last


@pytest.mark.slow
def test_a_stream_resumes_after_kill_9_and_a_restart(tmp_path: Path, upstream: ChatServer):
    upstream.script.append(slow_reply(0.1))
    db, port, log = tmp_path / "chat.db", free_port(), tmp_path / "server.log"
    with serve(db, upstream, port=port, log=log) as (base, proc):
        run_id, before, last = read_some(base, {"Idempotency-Key": "crash"})
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=5)
    # The resume goes on from the text the run had saved (SPEC §6): the endpoint, asked
    # to continue it, streams the rest.
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT text FROM checkpoint_partials ORDER BY turn, idx").fetchall()
    saved = "".join(r[0] for r in rows)
    assert "".join(PIECES).startswith(saved)
    upstream.script.append(slow_reply(0.02, PIECES[len(re.findall(r"\S+\s*", saved)) :]))
    with serve(db, upstream, port=port, log=log) as (base, _):
        rest = httpx.get(
            f"{base}/v1/runs/{run_id}/events", headers={"Last-Event-ID": last}, timeout=60
        )
        after = events(rest.text)
        assert content(events(before)) + content(after) == "".join(PIECES)
        assert after[-1] == (None, "[DONE]")
        # The same request again: the same answer, with no model call.
        again = httpx.post(
            base + "/v1/chat/completions",
            json={**BODY, "stream": False},
            headers={"Idempotency-Key": "crash"},
            timeout=30,
        )
        assert again.json()["choices"][0]["message"]["content"] == "".join(PIECES)
        assert again.json()["id"] == f"chatcmpl-{run_id}"
    assert len(upstream.received) == 2  # the run, and its resume: nothing more


def test_a_stream_started_on_one_process_resumes_on_the_other(
    postgres_dsn: str, tmp_path: Path, upstream: ChatServer
):
    upstream.script.append(slow_reply(0.05))
    with (
        serve(postgres_dsn, upstream, log=tmp_path / "a.log") as (first, _),
        serve(postgres_dsn, upstream, log=tmp_path / "b.log") as (second, _),
    ):
        run_id, before, last = read_some(first)
        rest = httpx.get(
            f"{second}/v1/runs/{run_id}/events", headers={"Last-Event-ID": last}, timeout=60
        )
        after = events(rest.text)
        assert content(events(before)) + content(after) == "".join(PIECES)
        assert after[-1] == (None, "[DONE]")
        # Once ended, the whole stream reads the same from both processes.
        whole = [
            content(events(httpx.get(f"{b}/v1/runs/{run_id}/events", timeout=30).text))
            for b in (first, second)
        ]
        assert whole == ["".join(PIECES)] * 2
    assert len(upstream.received) == 1


@pytest.mark.slow
def test_a_resumed_run_nobody_comes_back_for_is_stopped(tmp_path: Path, upstream: ChatServer):
    held = Reply(body=[chunk({"role": "assistant", "content": ""}), chunk({"content": "so"})])
    held.hold = 30
    upstream.script += [slow_reply(0.1), held]  # the first, then its resume, which hangs
    db, port, log = tmp_path / "chat.db", free_port(), tmp_path / "server.log"
    flags = ("--api-orphan-seconds", "1")
    with serve(db, upstream, *flags, port=port, log=log) as (base, proc):
        run_id, _, _ = read_some(base)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=5)
    with serve(db, upstream, *flags, port=port, log=log) as (base, _):
        assert upstream.disconnected.wait(20)  # the resumed run's model call, given up
        ended = httpx.get(f"{base}/v1/runs/{run_id}/events", timeout=30)
        assert events(ended.text)[-1] == (None, "[DONE]")
    assert len(upstream.received) == 2


def test_a_key_revoked_on_one_process_is_refused_at_once_by_the_other(
    postgres_dsn: str, tmp_path: Path, upstream: ChatServer
):
    made = subprocess.run(
        [sys.executable, "-m", "webapp", "users", "add", "carol", "--password-stdin"]
        + ["--db", postgres_dsn],
        input="correct horse battery staple",
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    flags = ("--auth", "password")
    with (
        serve(postgres_dsn, upstream, *flags, log=tmp_path / "a.log") as (first, _),
        serve(postgres_dsn, upstream, *flags, log=tmp_path / "b.log") as (second, _),
        httpx.Client(base_url=first, timeout=20) as browser,
    ):
        signed = browser.post(
            "/login", data={"name": "carol", "password": "correct horse battery staple"}
        )
        assert signed.status_code == 303
        page = browser.post("/api-keys", data={"label": "laptop"}).text
        key = re.search(r'<code id="new-key" data-key>([^<]+)</code>', page).group(1)  # type: ignore[union-attr]
        bearer = {"Authorization": f"Bearer {key}"}
        assert httpx.get(second + "/v1/models", headers=bearer).status_code == 200
        key_id = re.search(r'data-key-id="([0-9a-f]+)"', page).group(1)  # type: ignore[union-attr]
        assert browser.post(f"/api-keys/{key_id}/revoke").status_code == 303
        refused = httpx.get(second + "/v1/models", headers=bearer)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
