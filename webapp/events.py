"""Events a streamed run emits, in order; exactly one terminal event ends a stream.

RunCompleted, RunFailed, RunCancelled and RunPaused are terminal. RunCancelled
carries the run's finished entries plus the partial assistant text already
streamed in the interrupted turn, so a caller can keep what the user saw.
RunPaused ends a run whose tool calls wait for the user's decision: the run is
durable as interrupted and nothing waits in memory (`webapp.runtime.approvals`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from webapp.runtime.result import PendingApproval, RunResult
from webapp.transcript import Entry, ToolCallEntry, ToolResultEntry


@dataclass(frozen=True)
class RunStarted:
    run_id: str
    agent_name: str
    resumed: bool = False


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStarted:
    call: ToolCallEntry


@dataclass(frozen=True)
class ToolCallFinished:
    result: ToolResultEntry


@dataclass(frozen=True)
class TurnEnded:
    turn: int


@dataclass(frozen=True)
class HandoffOccurred:
    from_agent: str
    to_agent: str


@dataclass(frozen=True)
class RunCompleted:
    result: RunResult


@dataclass(frozen=True)
class RunFailed:
    error: BaseException
    entries: list[Entry] = field(default_factory=list)


@dataclass(frozen=True)
class RunCancelled:
    entries: list[Entry] = field(default_factory=list)


@dataclass(frozen=True)
class RunPaused:
    pending: list[PendingApproval]
    entries: list[Entry] = field(default_factory=list)


TerminalEvent = Union[RunCompleted, RunFailed, RunCancelled, RunPaused]
Event = Union[
    RunStarted,
    TextDelta,
    ReasoningDelta,
    ToolCallStarted,
    ToolCallFinished,
    TurnEnded,
    HandoffOccurred,
    RunCompleted,
    RunFailed,
    RunCancelled,
    RunPaused,
]
TERMINAL_EVENTS = (RunCompleted, RunFailed, RunCancelled, RunPaused)


def joined_deltas(events: list[Event]) -> list[Event]:
    """``events`` with each run of `TextDelta` (or of `ReasoningDelta`) joined into one.

    What a reader shows is the same; the work per delta is done once for the run.
    """
    if len(events) < 2:
        return events
    out: list[Event] = []
    pieces: list[str] = []
    kind: type | None = None
    for event in events:
        if type(event) is kind:
            pieces.append(event.text)  # type: ignore[union-attr]
            continue
        if kind is not None:
            out.append(kind("".join(pieces)))
            kind = None
        if type(event) in (TextDelta, ReasoningDelta):
            kind, pieces = type(event), [event.text]  # type: ignore[union-attr]
        else:
            out.append(event)
    if kind is not None:
        out.append(kind("".join(pieces)))
    return out
