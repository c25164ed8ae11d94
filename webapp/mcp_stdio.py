"""The stdio transport to an MCP server, with each message bounded in bytes (SPEC §17).

The SDK's own stdio transport reads a server's output line by line with no
bound, and parses each line on the event loop. A tool that answered 20 MB held
the loop 1.4-1.9 s several times; the pings waited behind it, the server was
declared failed, and every chat lost its tools until a restart. Here:
- a line (one JSON-RPC message) longer than `MAX_MESSAGE_BYTES` is never kept
  whole: it is skipped as it arrives, and the call it answers gets an error
  ("larger than 4 MB") that the model reads -- the server stays connected. The
  answer's id is read from the line's first or last bytes (where JSON-RPC
  libraries write it), or is the one call waiting when only one is;
- a line over `PARSE_OFF_LOOP_BYTES` is parsed on a worker thread.
Otherwise it does what the SDK's does: the same inherited environment, the
process in a session of its own, ended (its group, on POSIX) when the
connection closes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import StdioServerParameters, types
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

logger = logging.getLogger("webapp.mcp_servers")

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
PARSE_OFF_LOOP_BYTES = 64 * 1024
TERMINATE_SECONDS = 2.0
_EDGE = 4096  # bytes kept of an oversized line's start and end, to find its id
_ID = r'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")'
_ID_AT_START = re.compile(r'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?' + _ID)
_ID_AT_END = re.compile(_ID + r"\s*\}\s*$")

Pending = Callable[[], list[types.RequestId]]


@contextlib.asynccontextmanager
async def bounded_stdio_client(
    params: StdioServerParameters,
    pending: Pending,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> AsyncIterator[tuple[Any, Any]]:
    """``(read, write)`` streams to the server ``params`` starts, as the SDK's
    ``stdio_client`` gives them. ``pending``: the ids of the calls waiting for an answer."""
    inherited = get_default_environment()
    env = {**inherited, **params.env} if params.env is not None else inherited
    process = await anyio.open_process(
        [params.command, *params.args],
        env=env,
        stderr=sys.stderr,
        cwd=params.cwd,
        start_new_session=True,
    )
    read_writer: MemoryObjectSendStream[SessionMessage | Exception]
    read_stream: MemoryObjectReceiveStream[SessionMessage | Exception]
    read_writer, read_stream = anyio.create_memory_object_stream(0)
    write_stream: MemoryObjectSendStream[SessionMessage]
    write_reader: MemoryObjectReceiveStream[SessionMessage]
    write_stream, write_reader = anyio.create_memory_object_stream(0)
    lines = _Lines(max_bytes, pending)

    async def read() -> None:
        assert process.stdout is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async with read_writer:
                async for chunk in process.stdout:
                    for message in await lines.feed(chunk):
                        await read_writer.send(message)

    async def write() -> None:
        assert process.stdin is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async with write_reader:
                async for outgoing in write_reader:
                    text = outgoing.message.model_dump_json(by_alias=True, exclude_none=True)
                    await process.stdin.send((text + "\n").encode())

    async with anyio.create_task_group() as tasks, process:
        tasks.start_soon(read)
        tasks.start_soon(write)
        try:
            yield read_stream, write_stream
        finally:
            await _end(process)
            for stream in (read_stream, write_stream, read_writer, write_reader):
                await stream.aclose()


async def _end(process: Process) -> None:
    """Close the server's input, give it a moment to exit, then end its process group."""
    if process.stdin is not None:
        with contextlib.suppress(Exception):
            await process.stdin.aclose()
    with contextlib.suppress(TimeoutError, ProcessLookupError):
        with anyio.fail_after(TERMINATE_SECONDS):
            await process.wait()
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(TimeoutError, ProcessLookupError):
            with anyio.fail_after(TERMINATE_SECONDS):
                await process.wait()
            return


class _Lines:
    """Bytes from the server, cut into messages; an oversized one skipped as it comes."""

    def __init__(self, max_bytes: int, pending: Pending) -> None:
        self.max_bytes = max_bytes
        self.pending = pending
        self.buffer = bytearray()
        self.skipping = 0  # bytes of the oversized line skipped so far (0: not skipping)
        self.head = b""
        self.tail = b""

    async def feed(self, chunk: bytes) -> list[SessionMessage | Exception]:
        out: list[SessionMessage | Exception] = []
        start = 0
        while start <= len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if self.skipping:
                self.skipping += len(piece)
                self.tail = (self.tail + piece)[-_EDGE:]
            else:
                self.buffer += piece
                if len(self.buffer) > self.max_bytes:
                    self.head, self.tail = bytes(self.buffer[:_EDGE]), bytes(self.buffer[-_EDGE:])
                    self.skipping = len(self.buffer)
                    self.buffer = bytearray()
            if end < 0:
                break
            if self.skipping:
                refused = self._refused()
                if refused is not None:
                    out.append(refused)
                self.skipping = 0
            elif self.buffer.strip():
                out.append(await _parsed(bytes(self.buffer)))
                self.buffer = bytearray()
            else:
                self.buffer = bytearray()
            start = end + 1
        return out

    def _refused(self) -> SessionMessage | None:
        """An error answer to the call the oversized line answered, if it can be told."""
        size = self.skipping
        request_id = _request_id(self.head, self.tail, self.pending())
        if request_id is None:
            logger.warning(
                "an MCP server sent a message of %d bytes (more than %d); it was dropped, and "
                "which call it answered could not be told",
                size,
                self.max_bytes,
            )
            return None
        limit = self.max_bytes // (1024 * 1024) or 1
        logger.warning(
            "an MCP server answered call %s with %d bytes (more than %d): refused",
            request_id,
            size,
            self.max_bytes,
        )
        error = types.ErrorData(
            code=types.INTERNAL_ERROR,
            message=f"the result is larger than {limit} MB ({size:,} bytes); ask for less",
        )
        answer = types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
        return SessionMessage(types.JSONRPCMessage(answer))


def _request_id(head: bytes, tail: bytes, pending: list[types.RequestId]) -> types.RequestId | None:
    for pattern, edge in ((_ID_AT_START, head), (_ID_AT_END, tail)):
        found = pattern.search(edge.decode("utf-8", "replace"))
        if found is not None:
            value = json.loads(found.group(1))
            if value in pending:
                return value  # type: ignore[no-any-return]
    return pending[0] if len(pending) == 1 else None


async def _parsed(line: bytes) -> SessionMessage | Exception:
    try:
        if len(line) > PARSE_OFF_LOOP_BYTES:
            message = await anyio.to_thread.run_sync(types.JSONRPCMessage.model_validate_json, line)
        else:
            message = types.JSONRPCMessage.model_validate_json(line)
    except Exception as exc:  # noqa: BLE001 -- the SDK's way: the session logs it, goes on
        logger.warning("an MCP server sent a message that is not JSON-RPC: %s", exc)
        return exc
    return SessionMessage(message)
