"""kill -9 in the middle of a reply, restart on the same file: the run resumes and completes."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from webhelpers import (
    cli_env,
    free_port,
    parse_html,
    replies,
    reply_text,
    stop_process,
    wait_serving,
)

pytestmark = pytest.mark.slow  # real servers killed with SIGKILL and restarted

COUNT = 400
EXPECTED = " ".join(str(i) for i in range(1, COUNT + 1))


# `python -m webapp` on a disk that never finishes writing a checkpoint: a run's
# first save is still on its way when the process dies.
STALLED_CHECKPOINTS = """
import asyncio, sys
from webapp.stores import sqlite_checkpoint

async def never(self, run_id, entries, head):
    await asyncio.Event().wait()

sqlite_checkpoint.SQLiteCheckpointer.append = never
from webapp.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


@contextmanager
def server(
    db: Path, port: int, log: Path, *, stalled: bool = False
) -> Iterator[subprocess.Popen[bytes]]:
    program = ["-c", STALLED_CHECKPOINTS] if stalled else ["-m", "webapp"]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, *program, "--port", str(port), "--db", str(db)]
            + ["--offline-delay", "0.01"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=cli_env(),
        )
    try:
        wait_serving(f"http://127.0.0.1:{port}", proc, log)
        yield proc
    finally:
        stop_process(proc)


def reply_now(http: httpx.Client, chat_id: str) -> tuple[str, str, str]:
    page = parse_html(http.get(f"/chats/{chat_id}").text)
    (reply,) = replies(page)
    return reply.attrs["data-run-id"] or "", reply.attrs["data-status"] or "", reply_text(reply)


def streaming_run(http: httpx.Client, chat_id: str) -> str:
    """The id of the chat's reply once 20 words of it have streamed."""
    deadline = time.monotonic() + 10
    while True:
        run_id, status, text = reply_now(http, chat_id)
        if len(text.split()) >= 20:
            assert status == "streaming"
            return run_id
        assert time.monotonic() < deadline, "the reply did not start streaming"
        time.sleep(0.05)


def completed_text(http: httpx.Client, chat_id: str, run_id: str) -> str:
    """The reply's text once ``run_id`` (and no other run) has completed it."""
    deadline = time.monotonic() + 30
    while True:
        again, status, text = reply_now(http, chat_id)
        assert again == run_id
        if status == "completed":
            return text
        assert status == "streaming", status
        assert time.monotonic() < deadline, "the run did not complete"
        time.sleep(0.1)


def test_kill_9_mid_run_then_restart_completes_the_same_run(tmp_path: Path):
    db, port, log = tmp_path / "chat.db", free_port(), tmp_path / "server.log"
    base = f"http://127.0.0.1:{port}"
    with server(db, port, log) as proc, httpx.Client(base_url=base, timeout=5) as http:
        chat_id = http.post("/chats").headers["location"].rsplit("/", 1)[1]
        http.post(f"/chats/{chat_id}/messages", data={"text": f"count to {COUNT}"})
        run_id = streaming_run(http, chat_id)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=5)
    with server(db, port, log), httpx.Client(base_url=base, timeout=5) as http:
        # Reopened: the same run, streaming again, and then complete -- exactly once.
        assert completed_text(http, chat_id, run_id) == EXPECTED
        page = parse_html(http.get(f"/chats/{chat_id}").text)
        assert len(page.find_all(data_role="user")) == 1
        assert len(page.find_all(data_role="assistant")) == 1


def test_kill_9_before_the_first_checkpoint_then_restart_keeps_the_message(tmp_path: Path):
    db, port, log = tmp_path / "chat.db", free_port(), tmp_path / "server.log"
    base = f"http://127.0.0.1:{port}"
    with server(db, port, log, stalled=True) as proc, httpx.Client(base_url=base) as http:
        chat_id = http.post("/chats").headers["location"].rsplit("/", 1)[1]
        http.post(f"/chats/{chat_id}/messages", data={"text": f"count to {COUNT}"})
        # the reply streams while its first checkpoint is still being written
        run_id = streaming_run(http, chat_id)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=5)
    with sqlite3.connect(db) as conn:  # what the crash left: the run, no checkpoint of it
        assert conn.execute("SELECT count(*) FROM checkpoint_heads").fetchone() == (0,)
    with server(db, port, log), httpx.Client(base_url=base, timeout=5) as http:
        assert completed_text(http, chat_id, run_id) == EXPECTED
        page = parse_html(http.get(f"/chats/{chat_id}").text)
        users = page.find_all(data_role="user")
        assert len(users) == 1 and f"count to {COUNT}" in users[0].text()
        assert len(page.find_all(data_role="assistant")) == 1
