"""Start-up and shutdown through one AsyncExitStack: whatever started is stopped,
whatever raised on the way (issue 28)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from webapp.config import AppConfig, McpServerConfig
from webapp.web import create_app

SERVER = Path(__file__).resolve().parents[1] / "mcp_server.py"


def server_processes(tmp_path: Path) -> list[int]:
    """The pids of the test MCP server processes started for ``tmp_path``."""
    found = subprocess.run(
        ["pgrep", "-f", f"{SERVER} {tmp_path}"], capture_output=True, text=True, check=False
    )
    return [int(pid) for pid in found.stdout.split()]


async def test_a_recovery_that_fails_after_the_tool_servers_started_stops_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    server = McpServerConfig(name="test", command=sys.executable, args=(str(SERVER), str(tmp_path)))
    app = create_app(tmp_path / "chat.db", config=AppConfig(mcp_servers=(server,)))
    state = app.state.web
    started: list[int] = []

    async def broken_recovery() -> int:
        servers = state.agents.servers
        assert servers is not None and await servers.wait_connected("test", 30)
        started.extend(server_processes(tmp_path))
        raise RuntimeError("recovery failed")

    monkeypatch.setattr(state.runs, "recover", broken_recovery)
    with pytest.raises(RuntimeError, match="recovery failed"):
        async with app.router.lifespan_context(app):
            pytest.fail("the app must not serve after its start-up failed")
    assert started, "the tool server was running when recovery failed"
    deadline = time.monotonic() + 10
    while server_processes(tmp_path) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert server_processes(tmp_path) == []


async def test_a_close_that_raises_does_not_skip_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    app = create_app(tmp_path / "chat.db")
    state = app.state.web
    closed: list[str] = []

    async def broken_close() -> None:
        closed.append("chats")
        raise OSError("disk gone")

    def recorded(name: str, close):  # type: ignore[no-untyped-def]
        async def wrapper() -> None:
            closed.append(name)
            await close()

        return wrapper

    really_close = state.store.close
    monkeypatch.setattr(state.store, "close", broken_close)
    monkeypatch.setattr(state.session, "close", recorded("session", state.session.close))
    monkeypatch.setattr(
        state.checkpointer, "close", recorded("checkpoints", state.checkpointer.close)
    )
    monkeypatch.setattr(
        state.models.registry, "aclose", recorded("models", state.models.registry.aclose)
    )
    with pytest.raises(OSError, match="disk gone"):
        async with app.router.lifespan_context(app):
            pass
    assert closed == ["chats", "session", "checkpoints", "models"]
    await really_close()
