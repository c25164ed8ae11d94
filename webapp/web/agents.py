"""The agent a chat's run starts or resumes with: composed per chat, at each start and resume.

`ChatAgents.chat_agent` is the one place that decides what a chat's run gets:
the app's agent (its built-in tools), the chat's model and instructions
(`webapp.web.chat_models`), its project's instructions before them (SPEC §15), the tools of the MCP servers connected right now
(SPEC §11: a server that is down offers nothing until it is back), and the
chat's **Always allow** grants, which turn those tools' "ask" into "allow". It is read again at every start and every
resume, so a grant or a server that came back counts from the next step on.

The model is sent every very long tool result cut short, with a marker that says
so (`webapp.models.long_results`); the user sees the whole result.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from webapp.chats.project_files import ProjectFileContext
from webapp.chats.projects import Project
from webapp.chats.store import ChatStore
from webapp.mcp_servers import McpServers
from webapp.models.attached import FileContents, WithAttachments
from webapp.models.long_results import CutLongResults
from webapp.models.with_context import WithContext
from webapp.runtime.agent import Agent, Instructions, RunContext
from webapp.runtime.model import Model
from webapp.runtime.tool import Tool
from webapp.web.api.caller_tools import caller_tools
from webapp.web.chat_models import ChatModels


class ChatAgents:
    """The app's agent, made each chat's own (`chat_agent`)."""

    def __init__(
        self,
        base: Agent,
        servers: McpServers | None,
        store: ChatStore,
        models: ChatModels | None = None,
        files: FileContents | None = None,
        context_chars: int = 60_000,
    ) -> None:
        self.base = base
        self.servers = servers  # None: no config file, or one with no MCP servers
        self.store = store
        self.models = models  # the chat's model and instructions (None: the base agent's)
        self.files = files  # what a user message's attachments hold, for the model
        self.context_chars = context_chars  # how much of a project's files a call is sent

    @property
    def builtin_tools(self) -> Sequence[Tool]:
        return self.base.tools

    async def chat_agent(self, chat_id: str) -> Agent:
        """The agent for a run of ``chat_id``, as of now."""
        # One statement each, asked at once: the store answers them back to back.
        granted, brought, project = await asyncio.gather(
            self.store.approvals.grants(chat_id),
            self.store.api_runs.tools_of(chat_id),
            self.store.projects.project_of(chat_id),
        )
        offered = [*self.base.tools, *(self.servers.tools() if self.servers else [])]
        if brought is not None:  # a program's chat: its own tools only (SPEC §16)
            offered = caller_tools(brought)
        tools = [
            replace(t, approval="allow") if t.approval == "ask" and t.name in granted else t
            for t in offered
        ]
        agent = replace(self.base, tools=tools)
        if self.models is not None:
            agent = await self.models.apply(agent, chat_id)
        agent = _in_project(agent, project)
        model: Model | None = CutLongResults(agent.model) if agent.model is not None else None
        if model is not None and self.files is not None:
            model = WithAttachments(model, self.files)  # images and documents, as sent (§14)
        if model is not None and project is not None:  # the project's files (§15)
            files = ProjectFileContext(
                self.store.files, self.store.project_files, chat_id, self.context_chars
            )
            model = WithContext(model, files)
        return replace(agent, model=model)


def _in_project(agent: Agent, project: Project | None) -> Agent:
    """The chat's project's instructions, if any, before the chat's own (SPEC §15)."""
    if project is None or not project.instructions.strip():
        return agent
    own = agent.instructions
    if isinstance(own, str):
        return replace(agent, instructions=_joined(project.instructions, own))
    composed: Instructions = _Prefixed(project.instructions, own)
    return replace(agent, instructions=composed)


def _joined(first: str, then: str) -> str:
    return f"{first.strip()}\n\n{then}" if then.strip() else first.strip()


class _Prefixed:
    """Dynamic instructions (a callable) with the project's in front of them."""

    def __init__(self, first: str, then: Callable[[RunContext], str | Awaitable[str]]) -> None:
        self.first = first
        self.then = then

    async def __call__(self, context: RunContext) -> str:
        then = self.then(context)
        return _joined(self.first, await then if inspect.isawaitable(then) else then)
