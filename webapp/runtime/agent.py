"""Agent: configuration only -- one instance serves any number of concurrent runs."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from webapp.runtime.tool import RunContext, Tool
from webapp.transcript import Entry, ToolCallEntry, ToolResultEntry
from webapp.usage import Usage

if TYPE_CHECKING:
    from webapp.runtime.context_policy import ContextPolicy
    from webapp.runtime.model import Model

Instructions = Union[str, Callable[[RunContext], str | Awaitable[str]]]
OutputGuardrail = Callable[[RunContext, str], Any]

HANDOFF_PREFIX = "transfer_to_"


class RunHooks:
    """Override any of these to observe a run; all are awaited in order."""

    async def on_run_start(self, ctx: RunContext) -> None:
        pass

    async def on_tool_start(self, ctx: RunContext, call: ToolCallEntry) -> None:
        pass

    async def on_tool_end(self, ctx: RunContext, result: ToolResultEntry) -> None:
        pass

    async def on_run_end(self, ctx: RunContext, result: RunResult) -> None:
        pass


@dataclass(eq=False)
class Agent:
    name: str
    instructions: Instructions = ""
    model: Model | None = None
    tools: Sequence[Tool] = field(default_factory=list)
    handoffs: Sequence[Agent] = field(default_factory=list)
    output_guardrails: Sequence[OutputGuardrail] = field(default_factory=list)
    hooks: RunHooks | None = None
    context_policy: ContextPolicy | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"Agent name must be a non-empty string, got {self.name!r}")
        for t in self.tools:
            if not isinstance(t, Tool):
                raise TypeError(f"Agent {self.name!r}: {t!r} is not a Tool; decorate it with @tool")

    async def render_instructions(self, ctx: RunContext) -> str:
        if callable(self.instructions):
            text = self.instructions(ctx)
            if inspect.isawaitable(text):
                text = await text
            return str(text)
        return self.instructions

    def handoff_tool_name(self) -> str:
        return HANDOFF_PREFIX + self.name

    def graph(self) -> list[Agent]:
        """Every distinct agent reachable through ``handoffs``, this one first.

        Distinct means by identity: an agent reachable along several paths, or
        through a cycle, is listed once.
        """
        seen: set[int] = set()
        found: list[Agent] = []
        queue: list[Agent] = [self]
        while queue:
            agent = queue.pop(0)
            if id(agent) in seen:
                continue
            seen.add(id(agent))
            found.append(agent)
            queue.extend(agent.handoffs)
        return found

    def find(self, name: str) -> Agent | None:
        """The agent called ``name`` in this agent's handoff graph (itself included)."""
        return next((agent for agent in self.graph() if agent.name == name), None)


# What a run of an agent returns, here beside the agent it names (its hooks see it):
# `webapp.runtime.result` is where callers import them from.


@dataclass(frozen=True)
class PendingApproval:
    """A call waiting for the user; ``may_have_run``: a crash cut it short, it may
    have had its effect already."""

    call: ToolCallEntry
    may_have_run: bool = False


@dataclass(frozen=True)
class RunResult:
    run_id: str
    output: str
    entries: list[Entry]  # this run's own entries: its input and what it produced
    usage: Usage
    turns: int
    finish_reason: str | None  # a replay reports the one its completed head kept
    final_agent: Agent
    # A paused run's calls waiting for the user (output is then ""); empty once finished.
    interruptions: list[PendingApproval] = field(default_factory=list)
