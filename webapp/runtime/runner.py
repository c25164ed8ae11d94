"""The run loop: model turns and tool calls, checkpointed so a run survives a crash.

A run reads as a short sequence of steps (see `_Run.execute`): prepare the
checkpoint (start, resume or replay), settle tool calls a crash left without a
result, then alternate model turns and tool calls until the model answers
without calling a tool. Saves happen at run start, after every model turn and
after every tool result, so a crash loses at most the work in flight (a final
answer with no guardrail or hook after it is saved once, as completed). The
start's save is written while the first model request goes out (a reply's
first token does not wait for a disk flush); the next save waits for it, and
its failure fails the run there.

A run with no input after an unfinished assistant reply continues that reply
(see `webapp.runtime.continuation`), as a resume does its turn's streamed text
(`webapp.runtime.streaming`). A call of a tool that asks for approval pauses the
run (see `webapp.runtime.approvals`).

On success the order is fixed: checkpoint completed, *then* session append. A
run is never both "persisted as finished" and "still resumable"; a crash
between the two is healed by the next replay, because session appends are
idempotent per run_id.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Union

from webapp.errors import UserError
from webapp.events import (
    HandoffOccurred,
    PendingApproval,
    ReasoningDelta,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunStarted,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnEnded,
)
from webapp.runtime import approvals, streaming
from webapp.runtime.agent import Agent, RunHooks
from webapp.runtime.continuation import continues_final, segment_meta
from webapp.runtime.model import (
    FinishPart,
    ModelRequest,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    UsagePart,
)
from webapp.runtime.options import CheckpointOptions, existing_snapshot
from webapp.runtime.pacing import paced
from webapp.runtime.result import RunResult
from webapp.runtime.run_handle import RunHandle
from webapp.runtime.tool import RunContext, Tool
from webapp.stores.checkpoint import RunHead, RunSnapshot
from webapp.stores.session import Session
from webapp.transcript import (
    ENTRY_TYPES,
    AssistantEntry,
    Entry,
    ReasoningEntry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
    dangling_tool_calls,
    drop_dangling_tool_calls,
)

logger = logging.getLogger("webapp.runtime")

RunInput = Union[str, Sequence[Entry]]


# Loop control: what one model turn decided.
@dataclass(frozen=True)
class FinalOutput:
    text: str


@dataclass(frozen=True)
class RunAgain:
    calls: list[ToolCallEntry]


class Runner:
    """Runs agents. Stateless: everything a run needs is passed to each call."""

    @classmethod
    async def run(
        cls,
        agent: Agent,
        input: RunInput,
        *,
        session: Session | None = None,
        session_id: str | None = None,
        checkpoint: CheckpointOptions | None = None,
        context: Any = None,
        max_turns: int = 20,
        decisions: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Run to the end (or a pause) and return the result; raises the failed run's own
        exception. ``decisions`` are recorded in the paused run first (`record_decisions`)."""
        if decisions is not None:
            await approvals.record_for_resume(checkpoint, decisions)
        handle = cls.stream(
            agent,
            input,
            session=session,
            session_id=session_id,
            checkpoint=checkpoint,
            context=context,
            max_turns=max_turns,
        )
        try:
            async for _ in handle:
                pass
            return await handle.result()
        except asyncio.CancelledError:
            handle.cancel()  # our caller gave up: so does the run (and its model stream)
            raise

    @classmethod
    def stream(
        cls,
        agent: Agent,
        input: RunInput,
        *,
        session: Session | None = None,
        session_id: str | None = None,
        checkpoint: CheckpointOptions | None = None,
        context: Any = None,
        max_turns: int = 20,
    ) -> RunHandle:
        """Start the run as a task now; iterate the handle for its events."""
        run = _Run(agent, input, session, session_id, checkpoint, context, max_turns)
        return RunHandle(run)


@dataclass
class _Run:
    entry_agent: Agent
    input: RunInput
    session: Session | None
    session_id: str | None
    checkpoint: CheckpointOptions | None
    context: Any
    max_turns: int
    run_id: str = ""
    emit: Any = None
    agent: Agent = field(init=False)
    history: list[Entry] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)  # the run's own
    unsaved: list[Entry] = field(default_factory=list)
    head: RunHead = field(init=False)
    partial: list[str] = field(default_factory=list)  # pieces of the turn's text so far
    resumed: streaming.StreamedTurn | None = None  # saved text a resume's first turn continues
    saves: streaming.Saves = streaming.NO_SAVES  # saves the text of the turn in flight
    finish_reason: str | None = None
    call_ids: set[str] = field(default_factory=set)
    ctx: RunContext = field(init=False)
    completed: bool = False
    saved: bool = False  # this run has written its checkpoint at least once
    terminal_sent: bool = False
    inflight: asyncio.Future[None] | None = None  # the checkpoint save under way
    inflight_entries: list[Entry] = field(default_factory=list)  # what that save appends
    unawaited: bool = False  # nobody has awaited ``inflight`` yet: its error is still owed

    def __post_init__(self) -> None:
        self.agent = self.entry_agent
        self.run_id = self.checkpoint.run_id if self.checkpoint else uuid.uuid4().hex
        self.head = RunHead(agent_name=self.agent.name, session_id=self.session_id)
        self.ctx = RunContext(self.run_id, self.session_id, 0, self.context, self.agent.name)

    # --- the run, step by step ---------------------------------------------------

    async def execute(self) -> RunResult:
        try:
            self._check_arguments()
            # Both reads at once: a new run needs the history as soon as it knows it is new.
            snapshot, history = await asyncio.gather(
                existing_snapshot(self.checkpoint), self._load_history()
            )
            if snapshot is not None and snapshot.status == "completed":
                return await self._replay(snapshot)
            self.history = history
            if snapshot is not None:
                await self._restore(snapshot)
            else:
                await self._start()
            pending = await self._settle_dangling_calls()
            outcome = pending or await self._loop()
            if isinstance(outcome, list):
                return await self._pause(outcome)
            return await self._finish(outcome)
        except asyncio.CancelledError:
            if self.completed:  # too late to stop: the run is already durable as finished
                return await self._finish_after_late_cancel()
            await self._mark("interrupted")
            self.emit(RunCancelled(self._entries_seen()))
            raise
        except Exception as exc:
            await self._fail(exc)
            raise

    def _check_arguments(self) -> None:
        self._check_handoff_graph()
        approvals.check_can_pause(self.entry_agent, self.checkpoint)
        if self.session is not None and not self.session_id:
            raise UserError("Runner got session= without session_id=; pass the conversation's id")
        if self.max_turns < 1:
            raise UserError(f"max_turns must be >= 1, got {self.max_turns!r}")
        if isinstance(self.input, (list, tuple)):
            bad = [e for e in self.input if not isinstance(e, ENTRY_TYPES)]
            if bad:
                raise UserError(f"input lists must hold transcript entries, got {bad[0]!r}")
        elif not isinstance(self.input, str):
            raise UserError(
                f"input must be a string or a list of entries, got {type(self.input).__name__}"
            )

    def _check_handoff_graph(self) -> None:
        # A snapshot names its active agent only by name: with two agents of one
        # name a resume would silently continue as whichever the walk met first.
        # Checked for every run, not only resumes, so the mistake shows at once.
        counts = Counter(agent.name for agent in self.entry_agent.graph())
        duplicated = sorted(name for name, count in counts.items() if count > 1)
        if duplicated:
            raise UserError(
                f"{self.entry_agent.name!r}'s handoff graph has several distinct agents named "
                f"{', '.join(map(repr, duplicated))}; a run cannot tell which one is active. "
                "Give each agent a unique name (the same Agent object may appear more than once)"
            )

    async def _start(self) -> None:
        new: list[Entry] = (
            [UserEntry(self.input)] if isinstance(self.input, str) else list(self.input)
        )
        self.call_ids = _call_ids(self.history)
        self.head = replace(self.head, context_state=await self._carried_context_state())
        self._add(new)
        await self._save(wait=False)  # the input is on its way to disk before the model call
        self.emit(RunStarted(self.run_id, self.agent.name, False))
        await self._hook("on_run_start", self.ctx)

    async def _restore(self, snapshot: RunSnapshot) -> None:
        agent = self.entry_agent.find(snapshot.head.agent_name)
        if agent is None:
            raise UserError(
                f"run {self.run_id!r} was in agent {snapshot.head.agent_name!r}, which is not in "
                f"{self.entry_agent.name!r}'s handoff graph any more; it cannot be resumed"
            )
        self.agent = agent
        self.head = replace(snapshot.head, status="running", error=None, finish_reason=None)
        self.ctx.agent_name, self.ctx.turn, self.ctx.usage = (
            agent.name,
            self.head.turns,
            self.head.usage,
        )
        if self.session_id is None and snapshot.head.session_id:
            self.session_id = self.ctx.session_id = snapshot.head.session_id
        self.entries = list(snapshot.entries)
        self.call_ids = _call_ids(self.history) | _call_ids(self.entries)
        self.resumed = await streaming.resumable_turn(self.checkpoint, self.run_id, self.head.turns)
        await self._save()
        self.emit(RunStarted(self.run_id, self.agent.name, True))
        await self._hook("on_run_start", self.ctx)

    async def _settle_dangling_calls(self) -> list[PendingApproval]:
        """Calls a crash or a pause left without a result: run, decline or hold each."""
        calls = dangling_tool_calls(self.entries)  # same turn: head.turns was saved with them
        return await approvals.settle(self, self._tools(), calls)

    async def _loop(self) -> str | list[PendingApproval]:
        while True:
            if self.head.turns >= self.max_turns:
                raise UserError(
                    f"run {self.run_id!r} reached max_turns={self.max_turns} without a final "
                    "answer; raise max_turns or check the tools for a loop"
                )
            step = await self._model_turn()
            if isinstance(step, FinalOutput):
                self.emit(TurnEnded(self.head.turns))
                return step.text
            pending = await approvals.settle(self, self._tools(), step.calls)
            self.emit(TurnEnded(self.head.turns))
            if pending:
                return pending

    async def _model_turn(self) -> FinalOutput | RunAgain:
        model = self.agent.model
        if model is None:
            raise UserError(f"agent {self.agent.name!r} has no model; pass Agent(model=...)")
        view = self._model_view()
        resumed, self.resumed = self.resumed, None  # text saved before a crash: continued
        view = streaming.continue_view(view, resumed)
        request = ModelRequest(
            system=await self.agent.render_instructions(self.ctx),
            entries=view,
            tools=[t.spec for t in self._tools().values()],
            continue_final=resumed is not None or continues_final(self.entries, view),
        )
        reasoning, calls, self.finish_reason = (resumed.reasoning if resumed else ""), [], None
        self.partial = [resumed.text] if resumed and resumed.text else []
        self.saves = streaming.turn_saves(self.checkpoint, self.run_id, self.head.turns, resumed)
        async for part in paced(model.stream(request)):
            if isinstance(part, TextPart) and part.text:
                first = not self.partial
                self.partial.append(part.text)  # joined once: += would copy it per token
                self.saves.add_text(part.text)
                self.emit(TextDelta(part.text))
                if first:  # its readers send it on before the rest of a burst is read
                    await asyncio.sleep(0)
            elif isinstance(part, ReasoningPart) and part.text:
                reasoning += part.text
                self.saves.add_reasoning(part.text)
                self.emit(ReasoningDelta(part.text))
            elif isinstance(part, ToolCallPart):
                self.saves.mark_calls()
                calls.append(
                    ToolCallEntry(self._unique_call_id(part.call_id), part.name, part.arguments)
                )
            elif isinstance(part, UsagePart):
                self.head = replace(self.head, usage=self.head.usage + part.usage)
            elif isinstance(part, FinishPart):
                self.finish_reason = part.reason
        await self.saves.close(flush=False)  # the turn's own save, next, holds all of it
        text, self.partial = "".join(self.partial), []
        produced: list[Entry] = [ReasoningEntry(reasoning)] if reasoning else []
        produced += [AssistantEntry(text)] if text else []
        self.head = replace(self.head, turns=self.head.turns + 1)
        self.ctx.turn, self.ctx.usage = self.head.turns, self.head.usage
        self._add([*produced, *calls])
        if calls or not self._nothing_before_finish():
            await self._save()  # else the completed save, next, holds this turn
        return RunAgain(calls) if calls else FinalOutput(text)

    def _nothing_before_finish(self) -> bool:
        """No guardrail or hook runs between a final answer and the completed save."""
        return not self.agent.output_guardrails and self.agent.hooks is None

    async def run_tool(
        self,
        tools: Mapping[str, Tool],
        call: ToolCallEntry,
        declined: ToolResultEntry | None = None,
    ) -> None:
        """One call, as `approvals.settle` decided; a declined one never ran: no hooks."""
        self.emit(ToolCallStarted(call))
        if declined is None:
            await self._hook("on_tool_start", self.ctx, call)
        result = declined or await self._invoke(tools, call)
        policy = self.agent.context_policy
        if policy is not None:
            state = await policy.archive(self._session_key, result, self.head.context_state)
            self.head = replace(self.head, context_state=state)
        self._add([result])
        await self._save()
        if declined is None:
            await self._hook("on_tool_end", self.ctx, result)
        self.emit(ToolCallFinished(result))

    async def _invoke(self, tools: Mapping[str, Tool], call: ToolCallEntry) -> ToolResultEntry:
        target = next((a for a in self.agent.handoffs if a.handoff_tool_name() == call.name), None)
        if target is not None:
            previous, self.agent = self.agent, target
            self.head = replace(self.head, agent_name=target.name)
            self.ctx.agent_name = target.name
            self.emit(HandoffOccurred(previous.name, target.name))
            return ToolResultEntry(call.call_id, f"Transferred to {target.name}.")
        found = tools.get(call.name)
        if found is None:
            return ToolResultEntry(
                call.call_id,
                f"unknown tool {call.name!r}; available tools: {', '.join(sorted(tools)) or 'none'}",
                True,
            )
        return await found.invoke(self.ctx, call)

    async def _finish(self, output: str) -> RunResult:
        for guardrail in self.agent.output_guardrails:
            verdict = guardrail(self.ctx, output)
            if inspect.isawaitable(verdict):
                await verdict
        result = self._result(output, self.finish_reason)
        await self._hook("on_run_end", self.ctx, result)
        self.head = replace(
            self.head,
            status="completed",
            output=output,
            finish_reason=self.finish_reason,
            updated_at=time.time(),
        )
        await self._await_earlier_save()
        self.completed = True  # from here a cancel is too late: the save below is submitted
        await self._save()
        await self._persist_finished(self.entries, self.head)
        self.emit(RunCompleted(result))
        return result

    async def _pause(self, pending: list[PendingApproval]) -> RunResult:
        """Calls wait for the user: durable as interrupted, and no task waits (SPEC §11).
        No hook or guardrail runs and the session is not appended: the run is unfinished."""
        self.head = replace(self.head, status="interrupted")
        await self._save()
        self.emit(RunPaused(pending, list(self.entries)))
        return replace(self._result("", self.finish_reason), interruptions=pending)

    async def _replay(self, snapshot: RunSnapshot) -> RunResult:
        """A completed run: no model, no hooks, no guardrails; the session append heals."""
        agent = self.entry_agent.find(snapshot.head.agent_name)
        if agent is None:
            logger.warning(
                "replaying run %s: agent %r is gone; reporting entry agent %r instead",
                self.run_id,
                snapshot.head.agent_name,
                self.entry_agent.name,
            )
            agent = self.entry_agent
        self.agent = agent
        if self.session_id is None and snapshot.head.session_id:
            self.session_id = snapshot.head.session_id
        self.entries, self.head = list(snapshot.entries), snapshot.head
        self.completed = True
        await self._persist_finished(self.entries, self.head)
        result = self._result(snapshot.head.output or "", snapshot.head.finish_reason)
        self.emit(RunCompleted(result))
        return result

    async def _finish_after_late_cancel(self) -> RunResult:
        await self._settle_inflight()  # checkpoint completed first, then the session
        await self._persist_finished(self.entries, self.head)
        result = self._result(self.head.output or "", self.head.finish_reason)
        self.emit(RunCompleted(result))
        return result

    async def _fail(self, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        try:
            # A completed checkpoint stays completed (e.g. the session append failed):
            # the next submission replays it and the append heals.
            if not self.completed:
                await self._mark("failed", error=error)
        except Exception:  # the store itself may be what failed; the run's error wins
            logger.exception("run %s: could not record the failure in its checkpoint", self.run_id)
        self.emit(RunFailed(exc, self._entries_seen()))

    # --- helpers --------------------------------------------------------------------

    def _add(self, entries: list[Entry]) -> None:
        self.entries.extend(entries)
        self.unsaved.extend(entries)

    async def _save(self, *, wait: bool = True) -> None:
        """Append what is unsaved, after the save before it; ``wait=False`` returns
        once the save is submitted (it is awaited, and its error raised, next time)."""
        if self.checkpoint is None:
            return
        await self._await_earlier_save()
        new, self.unsaved = self.unsaved, []
        self.head = replace(self.head, updated_at=time.time())
        self.saved = True
        # Shielded: a cancel must not drop a save half-way (a queued SQLite write
        # whose caller is cancelled is skipped), and the entries are no longer in
        # `unsaved`, so an interrupt never appends them twice either.
        self.inflight = asyncio.ensure_future(
            self.checkpoint.checkpointer.append(self.run_id, new, self.head)
        )
        self.inflight_entries, self.unawaited = new, not wait
        if wait:
            await self._await_save()

    save = _save  # what `approvals.settle` calls

    async def _await_earlier_save(self) -> None:
        """Saves stay in order, and an unawaited save's failure is raised here."""
        if self.unawaited:
            self.unawaited = False
            await self._await_save()

    async def _await_save(self) -> None:
        assert self.inflight is not None
        try:
            await asyncio.shield(self.inflight)
        except Exception:
            # An append stores all or nothing: the entries go with the next save
            # (the failed run's, at least), and this failure is reported once.
            self.unsaved[:0] = self.inflight_entries
            self.inflight = None
            raise

    async def _mark(self, status: str, *, error: str | None = None) -> None:
        await streaming.close_quietly(self.saves, flush=True)  # a resume goes on from all of it
        if self.checkpoint is None or not self.saved:
            return  # refused before its first save: the stored run (if any) is not ours
        await self._settle_inflight()  # keep saves in order: this head must be the last
        self.head = replace(self.head, status=status, error=error)  # type: ignore[arg-type]
        await self._save()

    async def _settle_inflight(self) -> None:
        self.unawaited = False  # a failed save's error gives way to the run's own outcome
        if self.inflight is not None:
            with contextlib.suppress(Exception):
                await self._await_save()

    async def _persist_finished(self, entries: list[Entry], head: RunHead) -> None:
        if self.session is not None and self.session_id is not None:
            meta = segment_meta(head.context_state, head.finish_reason)
            await self.session.append(self.session_id, list(entries), run_id=self.run_id, meta=meta)
        cp = self.checkpoint
        if cp is not None and cp.delete_on_success:
            await cp.checkpointer.delete(self.run_id)

    async def _load_history(self) -> list[Entry]:
        if self.session is None or self.session_id is None:
            return []
        return drop_dangling_tool_calls(await self.session.load(self.session_id))

    async def _carried_context_state(self) -> dict[str, Any]:
        """A new run continues the policy state the session's last run ended with."""
        if self.agent.context_policy is None or self.session is None or self.session_id is None:
            return {}
        segments = await self.session.segments(self.session_id)
        meta = segments[-1].meta if segments else None
        state = (meta or {}).get("context_state")
        return dict(state) if isinstance(state, dict) else {}

    def _model_view(self) -> list[Entry]:
        entries = drop_dangling_tool_calls(self.history + self.entries)
        policy = self.agent.context_policy
        return policy.view(entries) if policy is not None else entries

    def _tools(self) -> dict[str, Tool]:
        tools = {t.name: t for t in self.agent.tools}
        policy = self.agent.context_policy
        if policy is not None:
            tools.update({t.name: t for t in policy.tools(self._session_key)})
        for target in self.agent.handoffs:
            name = target.handoff_tool_name()
            tools[name] = Tool(
                name,
                f"Hand the conversation over to {target.name}.",
                {"type": "object", "properties": {}},
                _no_op,
            )
        return tools

    @property
    def _session_key(self) -> str:
        return self.session_id or self.run_id

    def _unique_call_id(self, proposed: str) -> str:
        call_id = proposed or "call"
        while call_id in self.call_ids:  # some local servers send call_0 every turn
            call_id = f"{proposed or 'call'}_{uuid.uuid4().hex[:8]}"
        self.call_ids.add(call_id)
        return call_id

    def _entries_seen(self) -> list[Entry]:
        """Finished entries plus the partial text the user already saw."""
        return self.entries + ([AssistantEntry(text)] if (text := "".join(self.partial)) else [])

    def _result(self, output: str, finish_reason: str | None) -> RunResult:
        return RunResult(
            run_id=self.run_id,
            output=output,
            entries=list(self.entries),
            usage=self.head.usage,
            turns=self.head.turns,
            finish_reason=finish_reason,
            final_agent=self.agent,
        )

    async def _hook(self, name: str, *args: Any) -> None:
        hooks: RunHooks | None = self.agent.hooks
        if hooks is not None:
            await getattr(hooks, name)(*args)


def _call_ids(entries: list[Entry]) -> set[str]:
    return {e.call_id for e in entries if isinstance(e, ToolCallEntry)}


def _no_op() -> str:
    return ""


__all__ = ["FinalOutput", "RunAgain", "RunHandle", "Runner"]
