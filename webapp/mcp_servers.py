"""Tools from Model Context Protocol servers, through the official `mcp` SDK (1.x).

This module (with its transports `webapp.mcp_stdio` and `webapp.mcp_http`, which
bound each message a server sends) is the one that knows the SDK. `McpServers` starts (stdio) or
connects to (Streamable HTTP) every configured server, offers each server's
tools to the model as runtime `Tool`s and answers their calls. Invariants,
each named for the failure it prevents:
- a server that fails never stops the app: each server has a supervisor task
  that connects, lists the tools, watches the connection with pings and, when
  it fails or dies, marks it failed with the error (the Tools page shows it),
  withdraws its tools and tries again with a backoff (1 s, doubling, at most
  60 s);
- the app owns the processes it starts: `stop` ends every supervisor, which
  closes its session and so ends its stdio process;
- a stopped reply stops the server's work: a call whose task is cancelled (Stop)
  or that exceeds its ``timeout`` sends the server the protocol's
  ``notifications/cancelled`` for that request. SDK 1.x sends none by itself, and
  tells no caller a request's id, so the session's outgoing messages pass through
  `_Outgoing`, which notes the JSON-RPC id of each ``tools/call`` by a token the
  call carries in its ``_meta``;
- names the model sees are unique and valid OpenAI function names
  (``^[A-Za-z0-9_-]{1,64}$``): ``SERVER__TOOL``, cleaned, shortened with a hash
  when too long.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from mcp.shared.message import SessionMessage

from webapp.config import McpServerConfig, Policy
from webapp.mcp_http import HEADERS, bound_response
from webapp.mcp_stdio import Pending, bounded_stdio_client
from webapp.runtime.tool import RunContext, Tool
from webapp.transcript import ToolCallEntry, ToolResultEntry

logger = logging.getLogger("webapp.mcp_servers")

PING_SECONDS = 10.0  # how often a connected server is asked whether it is still there
BACKOFF_START, BACKOFF_MAX = 1.0, 60.0
CONNECT_TIMEOUT = 30.0  # seconds for a server to start, initialize and list its tools
_TOKEN_KEY = "webapp/call"  # in a tools/call's _meta: which of our calls it is
_NAME_OK = re.compile(r"[^A-Za-z0-9_-]")
_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


@dataclass
class ServerTool:
    """One tool a server lists, as the app offers it."""

    name: str  # the name the model sees
    remote_name: str
    description: str
    schema: dict[str, Any]
    policy: Policy
    read_only: bool
    idempotent: bool


@dataclass
class ServerState:
    """What the Tools page shows of one server."""

    config: McpServerConfig
    status: str = "starting"  # "starting" | "connected" | "failed"
    error: str | None = None
    tools: list[ServerTool] = field(default_factory=list)


@dataclass(frozen=True)
class McpTool(Tool):
    """A server's tool as the runtime sees it: a call goes to the server."""

    servers: McpServers | None = None
    server: str = ""
    remote_name: str = ""

    async def invoke(self, ctx: RunContext, call: ToolCallEntry) -> ToolResultEntry:
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolResultEntry(
                call.call_id, f"The arguments are not valid JSON: {exc.msg}", True
            )
        if not isinstance(arguments, dict):
            return ToolResultEntry(call.call_id, "The arguments must be a JSON object.", True)
        assert self.servers is not None  # always set by McpServers
        return await self.servers.call(self.server, self.remote_name, arguments, call.call_id)


class McpServers:
    """Every configured server, kept connected in the background."""

    def __init__(self, configs: Sequence[McpServerConfig]) -> None:
        self.states: dict[str, ServerState] = {c.name: ServerState(c) for c in configs}
        self._sessions: dict[str, _Connection] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._connected = {c.name: asyncio.Event() for c in configs}

    async def start(self) -> None:
        """Start a supervisor per server; returns at once (servers connect in the background)."""
        for state in self.states.values():
            task = asyncio.create_task(self._supervise(state), name=f"mcp:{state.config.name}")
            self._tasks.append(task)

    async def stop(self) -> None:
        """End every connection and every process the app started."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def wait_connected(self, name: str, timeout: float) -> bool:
        """True once server ``name`` is connected (for start-up checks and tests)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._connected[name].wait()
        return self.states[name].status == "connected"

    def tools(self) -> list[Tool]:
        """The runtime tools of every connected server, ``deny`` ones left out."""
        offered: list[Tool] = []
        for state in self.states.values():
            if state.status != "connected":
                continue
            for t in state.tools:
                if t.policy == "deny":
                    continue
                offered.append(self._runtime_tool(state.config.name, t))
        return offered

    def _runtime_tool(self, server: str, t: ServerTool) -> Tool:
        return McpTool(
            t.name,
            t.description,
            t.schema,
            _never_called,
            approval="ask" if t.policy == "ask" else "allow",
            rerunnable=t.read_only or t.idempotent,
            servers=self,
            server=server,
            remote_name=t.remote_name,
        )

    async def call(
        self, server: str, tool: str, arguments: dict[str, Any], call_id: str
    ) -> ToolResultEntry:
        """Call ``tool`` on ``server``; every failure is an error result the model reads."""
        connection = self._sessions.get(server)
        config = self.states[server].config
        if connection is None:
            error = self.states[server].error or "it is starting"
            return ToolResultEntry(
                call_id, f"The MCP server {server!r} is not connected ({error}).", True
            )
        token = uuid.uuid4().hex
        try:
            async with asyncio.timeout(config.timeout):
                result = await connection.session.call_tool(
                    tool, arguments, meta={_TOKEN_KEY: token}
                )
        except TimeoutError:
            await connection.cancel(token, f"no answer within {config.timeout:g} s")
            message = f"The tool {tool!r} did not answer within {config.timeout:g} seconds."
            return ToolResultEntry(call_id, message, True)
        except asyncio.CancelledError:
            await connection.cancel(token, "the user stopped the reply")
            raise
        except McpError as exc:
            return ToolResultEntry(
                call_id, f"The MCP server {server!r} refused the call: {exc}", True
            )
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            connection.lost.set()
            return ToolResultEntry(call_id, f"The MCP server {server!r} went away: {exc!r}", True)
        finally:
            connection.forget(token)
        return result_entry(call_id, result)

    # --- one server's life ------------------------------------------------------------

    async def _supervise(self, state: ServerState) -> None:
        delay = BACKOFF_START
        name = state.config.name
        while True:
            state.status, state.error = "starting", None
            try:
                await self._serve(state)
                error = "the server closed the connection"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- any failure is shown, then retried
                error = _describe(exc)
                if state.status == "connected":
                    delay = BACKOFF_START  # it did work: the next try comes soon
            finally:
                self._sessions.pop(name, None)
                self._connected[name].clear()
            state.status, state.error, state.tools = "failed", error, []
            logger.warning("MCP server %r failed: %s (retrying in %g s)", name, error, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)

    async def _serve(self, state: ServerState) -> None:
        """Connect, list the tools, then watch the connection until it fails."""
        config = state.config
        async with contextlib.AsyncExitStack() as stack:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                # The calls waiting for an answer: one whose answer is too big gets an error.
                read, write = await _open_transport(
                    stack, config, lambda: list(outgoing.request_ids.values())
                )
                outgoing = _Outgoing(write)
                forward = asyncio.create_task(outgoing.forward())
                stack.callback(forward.cancel)
                session = await stack.enter_async_context(ClientSession(read, outgoing.send_stream))
                await session.initialize()
                state.tools = name_tools(config, await _list_tools(session))
            connection = _Connection(session, outgoing)
            self._sessions[config.name] = connection
            state.status = "connected"
            self._connected[config.name].set()
            logger.info("MCP server %r connected: %d tools", config.name, len(state.tools))
            await connection.watch()


@dataclass
class _Connection:
    session: ClientSession
    outgoing: _Outgoing
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    async def watch(self) -> None:
        """Return when the server stops answering pings or a call found it gone."""
        while not self.lost.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PING_SECONDS):
                    await self.lost.wait()
            if self.lost.is_set():
                break
            async with asyncio.timeout(PING_SECONDS):
                await self.session.send_ping()
        raise ConnectionError("the connection to the server was lost")

    async def cancel(self, token: str, reason: str) -> None:
        """Tell the server to stop the request the call with ``token`` made (best effort)."""
        request_id = self.outgoing.request_ids.get(token)
        if request_id is None:
            return  # never sent: nothing runs on the server
        notice = types.CancelledNotification(
            params=types.CancelledNotificationParams(requestId=request_id, reason=reason)
        )
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await self.session.send_notification(types.ClientNotification(notice))

    def forget(self, token: str) -> None:
        self.outgoing.request_ids.pop(token, None)


class _Outgoing:
    """The session's outgoing messages, on their way to the transport: notes call ids."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.send_stream, self._receive = anyio.create_memory_object_stream[SessionMessage](16)
        self.request_ids: dict[str, types.RequestId] = {}

    async def forward(self) -> None:
        async for message in self._receive:
            root = message.message.root
            if isinstance(root, types.JSONRPCRequest) and root.method == "tools/call":
                meta = (root.params or {}).get("_meta") or {}
                token = meta.get(_TOKEN_KEY) if isinstance(meta, dict) else None
                if isinstance(token, str):
                    self.request_ids[token] = root.id
            await self.transport.send(message)


async def _open_transport(
    stack: contextlib.AsyncExitStack, config: McpServerConfig, pending: Pending
) -> Any:
    if config.command:
        params = StdioServerParameters(
            command=config.command,
            args=list(config.args),
            env=dict(config.env) or None,
            cwd=config.cwd,
        )
        read, write = await stack.enter_async_context(bounded_stdio_client(params, pending))
        return read, write
    assert config.url is not None  # the config requires one of the two
    client = await stack.enter_async_context(
        httpx.AsyncClient(
            headers={**HEADERS, **config.headers},
            timeout=httpx.Timeout(30.0, read=300.0),
            follow_redirects=True,
            event_hooks={"response": [bound_response]},  # 4 MB a message (webapp.mcp_http)
        )
    )
    read, write, _session_id = await stack.enter_async_context(
        streamable_http_client(config.url, http_client=client)
    )
    return read, write


async def _list_tools(session: ClientSession) -> list[types.Tool]:
    listed: list[types.Tool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
        listed.extend(page.tools)
        cursor = page.nextCursor
        if not cursor or len(listed) > 10_000:
            return listed


# --- names, policies, results ---------------------------------------------------------


def name_tools(config: McpServerConfig, listed: Sequence[types.Tool]) -> list[ServerTool]:
    """The server's tools with the names the model sees and the policy that applies."""
    taken: set[str] = set()
    tools = []
    for t in listed:
        hints = t.annotations
        read_only = bool(hints and hints.readOnlyHint)
        idempotent = bool(hints and hints.idempotentHint)
        tools.append(
            ServerTool(
                name=offered_name(config.name, t.name, taken),
                remote_name=t.name,
                description=t.description or t.title or t.name,
                schema=dict(t.inputSchema) if t.inputSchema else {"type": "object"},
                policy=policy_for(config, t.name, read_only),
                read_only=read_only,
                idempotent=idempotent,
            )
        )
    return tools


def policy_for(config: McpServerConfig, tool: str, read_only: bool) -> Policy:
    """The config's word for this tool, else the server's, else read-only ones run."""
    if tool in config.tools:
        return config.tools[tool]
    if config.approval is not None:
        return config.approval
    return "allow" if read_only else "ask"


def offered_name(server: str, tool: str, taken: set[str]) -> str:
    base = _NAME_OK.sub("_", f"{server}__{tool}")
    name = base if len(base) <= 64 else base[:55] + "_" + _digest(base)
    if name in taken:
        name = name[:55] + "_" + _digest(f"{server}\0{tool}\0{len(taken)}")
    taken.add(name)
    return name


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def result_entry(call_id: str, result: types.CallToolResult) -> ToolResultEntry:
    """Text as text, structured content as formatted JSON, images kept as images."""
    texts: list[str] = []
    images: list[str] = []
    for part in result.content:
        if isinstance(part, types.TextContent):
            texts.append(part.text)
        elif isinstance(part, types.ImageContent):
            if part.mimeType in _IMAGE_TYPES and _is_base64(part.data):
                images.append(f"data:{part.mimeType};base64,{part.data}")
                texts.append(f"[image: {part.mimeType}]")
            else:
                texts.append(f"[an image of type {part.mimeType!r} not shown]")
        elif isinstance(part, types.EmbeddedResource):
            resource = part.resource
            if isinstance(resource, types.TextResourceContents):
                texts.append(resource.text)
            else:
                texts.append(f"[binary resource {resource.uri}]")
        elif isinstance(part, types.ResourceLink):
            texts.append(f"[{part.name}]({part.uri})")
        else:
            texts.append(f"[{getattr(part, 'type', 'unknown')} content not shown]")
    structured = result.structuredContent
    if structured is not None and (not texts or _same_json(texts, structured)):
        # The spec asks servers to send structured content as text too; where that
        # text is the same JSON, show it formatted. Text that says more stays text.
        output = json.dumps(structured, indent=2, ensure_ascii=False)
    else:
        output = "\n\n".join(texts)
    return ToolResultEntry(call_id, output, bool(result.isError), images=tuple(images))


def _same_json(texts: list[str], structured: object) -> bool:
    try:
        return len(texts) == 1 and json.loads(texts[0]) == structured
    except ValueError:
        return False


def _is_base64(data: str) -> bool:
    try:
        base64.b64decode(data, validate=True)
    except ValueError:
        return False
    return True


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    if isinstance(exc, TimeoutError):
        return f"no answer within {CONNECT_TIMEOUT:g} s"
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


def _never_called(**_: Any) -> str:
    raise RuntimeError("an MCP tool is invoked through McpTool.invoke")
