"""A form body shorter than its Content-Length: a 408 in bounded time, and no traceback.

Driven over a real socket against `python -m webapp`, because the stall and the
disconnect happen below what an in-process transport can imitate.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from webhelpers import cli_env, free_port, parse_html, stop_process, wait_serving

BODY_TIMEOUT = 1.0  # seconds, given to the server as WEBAPP_BODY_TIMEOUT


@contextmanager
def server(tmp_path: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """The app on 127.0.0.1:``port``; its stderr goes to tmp_path/stderr.txt."""
    command = [sys.executable, "-m", "webapp", "--port", str(port)]
    with (tmp_path / "stderr.txt").open("wb") as err:
        proc = subprocess.Popen(
            [*command, "--db", str(tmp_path / "chat.db")],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=cli_env(WEBAPP_BODY_TIMEOUT=str(BODY_TIMEOUT)),
        )
    try:
        wait_serving(f"http://127.0.0.1:{port}", proc)
        yield proc
    finally:
        stop_process(proc)


def short_post(port: int) -> socket.socket:
    """A connection that has sent a form post's headers and 10 of its 100 bytes."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        "POST /chats HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        "Content-Length: 100\r\n\r\n"
    )
    sock.sendall(head.encode() + b"text=hello")
    return sock


def read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """(status line, body) of one response; the socket's timeout bounds every read."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-response"
        body += chunk
    return head.split(b"\r\n", 1)[0], body


def test_a_stalled_body_gets_408_and_a_vanished_client_no_traceback(tmp_path: Path):
    port = free_port()
    with server(tmp_path, port):
        # The client gives up mid-body: nothing can be answered, nothing must be logged.
        short_post(port).close()
        time.sleep(BODY_TIMEOUT / 4)  # well before the body timeout: a disconnect
        # The client stalls mid-body: a 408 once the body timeout has passed.
        started = time.monotonic()
        with short_post(port) as sock:
            status, body = read_response(sock)
        elapsed = time.monotonic() - started
        assert status.startswith(b"HTTP/1.1 408 "), status
        assert b"stopped arriving" in body
        assert BODY_TIMEOUT * 0.9 <= elapsed < BODY_TIMEOUT + 5, elapsed
        # The server is still serving, and neither post created a chat.
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
        assert page.status_code == 200
        assert parse_html(page.text).find("nav", aria_label="Chats").find_all("a") == []
    stderr = (tmp_path / "stderr.txt").read_text(errors="replace")
    assert "Traceback" not in stderr, stderr
    assert "Exception in ASGI application" not in stderr, stderr
