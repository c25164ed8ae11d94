"""What a finished run returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from webapp.transcript import Entry
from webapp.usage import Usage

if TYPE_CHECKING:
    from webapp.events import PendingApproval
    from webapp.runtime.agent import Agent


@dataclass(frozen=True)
class RunResult:
    run_id: str
    output: str
    entries: list[Entry]  # this run's own entries: its input and what it produced
    usage: Usage
    turns: int
    finish_reason: str | None  # None on a replay: it is not persisted
    final_agent: Agent
    # A paused run's calls waiting for the user (output is then ""); empty once finished.
    interruptions: list[PendingApproval] = field(default_factory=list)
