"""The API's tests: `python -m webapp` under uvicorn on 127.0.0.1, driven with the official
``openai`` client, in front of the scripted Chat Completions server of tests/models
(`chat_server.ChatServer`), which counts the requests it gets."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "models"))

from chat_server import API_KEY, ChatServer
from webhelpers import cli_env, free_port, stop_process, wait_serving

MODEL = "default/test-model"


@pytest.fixture(scope="module")
def _upstream() -> Iterator[ChatServer]:
    server = ChatServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def upstream(_upstream: ChatServer) -> Iterator[ChatServer]:
    _upstream.reset()
    yield _upstream


@contextmanager
def serve(
    db: Path | str, upstream: ChatServer, *flags: str, port: int | None = None, log: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`python -m webapp` on ``db`` with ``flags``; yields (base URL, process)."""
    port = port or free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "webapp", "--port", str(port), "--db", str(db)]
            + ["--base-url", upstream.base_url, "--model", "test-model", "--api-key", API_KEY]
            + list(flags),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=cli_env(),
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_serving(base, proc, log)
        yield base, proc
    finally:
        stop_process(proc)
