"""MCP servers through the SDK, against a real server over real stdio and HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from webapp.config import McpServerConfig
from webapp.mcp_servers import McpServers, offered_name
from webapp.runtime.tool import RunContext
from webapp.transcript import ToolCallEntry

SERVER = Path(__file__).with_name("mcp_server.py")


def stdio_config(tmp_path: Path, **kwargs: object) -> McpServerConfig:
    return McpServerConfig(
        name="test",
        command=sys.executable,
        args=(str(SERVER), str(tmp_path)),
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[McpServers]:
    running = McpServers([stdio_config(tmp_path, timeout=5.0)])
    await running.start()
    assert await running.wait_connected("test", 30), running.states["test"].error
    yield running
    await running.stop()


async def call(servers: McpServers, name: str, arguments: dict[str, object]):  # type: ignore[no-untyped-def]
    tool = next(t for t in servers.tools() if t.name == name)
    ctx = RunContext(run_id="r1", session_id="s1")
    return await tool.invoke(ctx, ToolCallEntry("c1", name, json.dumps(arguments)))


async def test_tools_are_offered_with_names_schemas_and_policies(servers: McpServers) -> None:
    tools = {t.name: t for t in servers.tools()}
    assert {"test__echo", "test__write_note", "test__slow", "test__picture"} <= set(tools)
    echo = tools["test__echo"]
    assert echo.description == "Return the text unchanged."
    assert echo.parameters["properties"]["text"]["type"] == "string"
    # read-only runs and is safe to re-run; an unannotated tool asks and is not
    assert (echo.approval, echo.rerunnable) == ("allow", True)
    assert (tools["test__write_note"].approval, tools["test__write_note"].rerunnable) == (
        "ask",
        False,
    )
    assert (tools["test__set_flag"].approval, tools["test__set_flag"].rerunnable) == ("ask", True)


async def test_a_call_returns_text_errors_images_and_structured_content(
    servers: McpServers, tmp_path: Path
) -> None:
    result = await call(servers, "test__echo", {"text": "héllo <b>"})
    assert (result.output, result.is_error) == ("héllo <b>", False)
    failed = await call(servers, "test__fail", {"reason": "because"})
    assert failed.is_error and "failed on purpose: because" in failed.output
    picture = await call(servers, "test__picture", {})
    assert picture.images and picture.images[0].startswith("data:image/png;base64,iVBOR")
    assert "[image: image/png]" in picture.output
    weather = await call(servers, "test__weather", {"city": "Oslo"})
    assert json.loads(weather.output) == {"city": "Oslo", "celsius": 21, "sky": "<b>clear</b>"}
    assert "\n  " in weather.output  # formatted
    await call(servers, "test__write_note", {"text": "one"})
    assert (tmp_path / "notes.txt").read_text() == "one\n"


async def test_a_cancelled_call_is_cancelled_on_the_server(
    servers: McpServers, tmp_path: Path
) -> None:
    task = asyncio.create_task(call(servers, "test__slow", {"seconds": 30}))
    log = tmp_path / "slow.log"
    await _until(lambda: log.exists() and "started" in log.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _until(lambda: "cancelled" in log.read_text())
    # the connection is still good
    assert (await call(servers, "test__echo", {"text": "after"})).output == "after"


async def test_a_call_past_its_timeout_is_an_error_result_and_cancelled(tmp_path: Path) -> None:
    running = McpServers([stdio_config(tmp_path, timeout=0.5)])
    await running.start()
    try:
        assert await running.wait_connected("test", 30)
        started = time.monotonic()
        result = await call(running, "test__slow", {"seconds": 30})
        assert time.monotonic() - started < 5
        assert result.is_error and "did not answer within 0.5 seconds" in result.output
        await _until(lambda: "cancelled" in (tmp_path / "slow.log").read_text())
    finally:
        await running.stop()


async def test_policies_from_the_config_override_annotations(tmp_path: Path) -> None:
    config = stdio_config(tmp_path, approval="ask", tools={"write_note": "allow", "fail": "deny"})
    running = McpServers([config])
    await running.start()
    try:
        assert await running.wait_connected("test", 30)
        tools = {t.name: t for t in running.tools()}
        assert "test__fail" not in tools  # deny: never offered
        assert tools["test__write_note"].approval == "allow"
        assert tools["test__echo"].approval == "ask"  # the server's default wins over the hint
    finally:
        await running.stop()


async def test_a_server_that_fails_to_start_does_not_stop_the_others(tmp_path: Path) -> None:
    broken = McpServerConfig(name="broken", command="/nonexistent/mcp-server")
    running = McpServers([broken, stdio_config(tmp_path)])
    await running.start()
    try:
        assert await running.wait_connected("test", 30)
        await _until(lambda: running.states["broken"].status == "failed")
        assert "/nonexistent/mcp-server" in (running.states["broken"].error or "")
        assert all(t.name.startswith("test__") for t in running.tools())
    finally:
        await running.stop()


@pytest.mark.slow
async def test_a_dead_server_is_restarted(servers: McpServers, tmp_path: Path) -> None:
    assert (await call(servers, "test__echo", {"text": "x"})).output == "x"
    os.kill(_server_pid(tmp_path), signal.SIGKILL)
    await _until(lambda: servers.states["test"].status != "connected", timeout=20)
    assert await servers.wait_connected("test", 30)
    assert (await call(servers, "test__echo", {"text": "back"})).output == "back"


async def test_streamable_http_with_headers(tmp_path: Path) -> None:
    port = _free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SERVER),
        str(tmp_path),
        "http",
        str(port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await _until(lambda: _listening(port), timeout=20)
        config = McpServerConfig(
            name="remote", url=f"http://127.0.0.1:{port}/mcp", headers={"Authorization": "Bearer t"}
        )
        running = McpServers([config])
        await running.start()
        try:
            assert await running.wait_connected("remote", 30), running.states["remote"].error
            assert (
                await call(running, "remote__echo", {"text": "over http"})
            ).output == "over http"
            # A result past the byte bound: an error, never read whole; the server stays.
            big = await call(running, "remote__big", {"chars": 5 * 1024 * 1024})
            assert big.is_error and "larger than 4 MB" in big.output, big.output[:200]
            fits = await call(running, "remote__big", {"chars": 1_000_000})
            assert not fits.is_error and len(fits.output) == 1_000_000
            assert running.states["remote"].status == "connected"
        finally:
            await running.stop()
    finally:
        process.kill()
        await asyncio.wait_for(process.wait(), 10)


def test_offered_names_are_unique_and_valid() -> None:
    taken: set[str] = set()
    names = [
        offered_name("files", "read.file", taken),
        offered_name("files", "read_file", taken),
        offered_name("x" * 32, "y" * 60, taken),
        offered_name("x" * 32, "y" * 60 + "z", taken),
    ]
    assert names[0] == "files__read_file" and len(set(names)) == 4
    assert all(len(n) <= 64 and n.replace("_", "a").replace("-", "a").isalnum() for n in names)


def _server_pid(tmp_path: Path) -> int:
    out = subprocess.run(
        ["pgrep", "-f", f"{SERVER} {tmp_path}"], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def _until(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


THIRD_PARTY = Path(__file__).with_name("mcp_servers") / "node_modules" / ".bin"


@pytest.mark.slow
async def test_the_reference_filesystem_server_from_the_registry(tmp_path: Path) -> None:
    """@modelcontextprotocol/server-filesystem, installed by the README's test command."""
    program = THIRD_PARTY / "mcp-server-filesystem"
    assert program.exists(), "run the README's test command: it installs tests/mcp_servers"
    shared = tmp_path / "share"
    shared.mkdir()
    (shared / "hello.txt").write_text("hello from a file", encoding="utf-8")
    running = McpServers([McpServerConfig(name="files", command=str(program), args=(str(shared),))])
    await running.start()
    try:
        assert await running.wait_connected("files", 60), running.states["files"].error
        tools = {t.name: t for t in running.tools()}
        # its own annotations decide: reading runs, writing asks first
        assert tools["files__read_text_file"].approval == "allow"
        assert tools["files__write_file"].approval == "ask"
        read = await call(running, "files__read_text_file", {"path": str(shared / "hello.txt")})
        assert "hello from a file" in read.output and not read.is_error
        wrote = await call(
            running, "files__write_file", {"path": str(shared / "new.txt"), "content": "written"}
        )
        assert not wrote.is_error, wrote.output
        assert (shared / "new.txt").read_text() == "written"
        outside = await call(running, "files__read_text_file", {"path": "/etc/hostname"})
        assert outside.is_error  # the server's own sandbox holds
    finally:
        await running.stop()


async def test_a_result_past_the_byte_bound_is_an_error_and_the_server_stays(
    tmp_path: Path,
) -> None:
    from webapp.mcp_stdio import MAX_MESSAGE_BYTES

    servers = McpServers([stdio_config(tmp_path, timeout=60.0)])  # 20 MB take the server a while
    await servers.start()
    try:
        assert await servers.wait_connected("test", 30), servers.states["test"].error
        result = await call(servers, "test__big", {"chars": 5 * MAX_MESSAGE_BYTES})  # 20 MB
        assert result.is_error and "larger than 4 MB" in result.output  # on main: 20 MB parsed
        assert servers.states["test"].status == "connected"
        echoed = await call(servers, "test__echo", {"text": "still here"})
        assert not echoed.is_error and echoed.output == "still here"
        fits = await call(servers, "test__big", {"chars": 1_000_000})
        assert not fits.is_error and len(fits.output) == 1_000_000
    finally:
        await servers.stop()
