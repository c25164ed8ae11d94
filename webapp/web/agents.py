"""The agent a chat's run starts or resumes with: composed per chat, at each start and resume.

`ChatAgents.chat_agent` is the one place that decides what a chat's run gets:
the app's agent (its model, instructions and built-in tools), the tools of the
MCP servers connected right now (SPEC §11: a server that is down offers
nothing until it is back), and the chat's **Always allow** grants, which turn
those tools' "ask" into "allow". It is read again at every start and every
resume, so a grant or a server that came back counts from the next step on.

The model is sent every very long tool result cut short, with a marker that says
so (`CutLongResults`): one result must not fill the model's context. The run's
entries, and so the session and the card the user sees, keep the whole result.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace

from webapp.chats.store import ChatStore
from webapp.mcp_servers import McpServers
from webapp.runtime.agent import Agent
from webapp.runtime.model import Model, ModelPart, ModelRequest
from webapp.runtime.tool import Tool
from webapp.transcript import Entry, ToolResultEntry

MAX_RESULT_CHARS = 20_000  # of one tool result, in what the model is sent


def cut_result(output: str, limit: int = MAX_RESULT_CHARS) -> str:
    """``output`` as the model reads it: at most ``limit`` characters, then a marker."""
    if len(output) <= limit:
        return output
    return (
        output[:limit] + f"\n[The tool's result was cut here: {len(output) - limit:,} more "
        "characters are not shown to you. The user sees the whole result.]"
    )


@dataclass(frozen=True)
class CutLongResults:
    """A model whose requests carry each tool result cut to ``limit`` characters."""

    model: Model
    limit: int = MAX_RESULT_CHARS

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        entries = [self._cut(e) for e in request.entries]
        return self.model.stream(replace(request, entries=entries))

    def _cut(self, entry: Entry) -> Entry:
        if isinstance(entry, ToolResultEntry) and len(entry.output) > self.limit:
            return replace(entry, output=cut_result(entry.output, self.limit))
        return entry


class ChatAgents:
    """The app's agent, made each chat's own (`chat_agent`)."""

    def __init__(self, base: Agent, servers: McpServers | None, chats: ChatStore) -> None:
        self.base = base
        self.servers = servers  # None: no config file, or one with no MCP servers
        self.chats = chats

    @property
    def builtin_tools(self) -> Sequence[Tool]:
        return self.base.tools

    async def chat_agent(self, chat_id: str) -> Agent:
        """The agent for a run of ``chat_id``, as of now."""
        granted = await self.chats.approvals.grants(chat_id)
        offered = [*self.base.tools, *(self.servers.tools() if self.servers else [])]
        tools = [
            replace(t, approval="allow") if t.approval == "ask" and t.name in granted else t
            for t in offered
        ]
        model = CutLongResults(self.base.model) if self.base.model is not None else None
        return replace(self.base, tools=tools, model=model)
