"""Checkpoint: how far one run has got, so it survives a crash.

A snapshot is the run's *own* entries (its input and everything it produced)
plus a small head that is replaced on every save. Entries are append-only:
a save costs what it adds, not the run's length, so long runs stay cheap.
The caller's context object is never stored; pass it again on resume.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, Protocol, runtime_checkable

from webapp.stores.streamed import InMemoryStreamed
from webapp.transcript import Entry
from webapp.usage import Usage

RunStatus = Literal["running", "interrupted", "completed", "failed"]
RUN_STATUSES = ("running", "interrupted", "completed", "failed")


@dataclass(frozen=True)
class RunHead:
    agent_name: str
    usage: Usage = field(default_factory=Usage)
    turns: int = 0
    status: RunStatus = "running"
    context_state: dict[str, Any] = field(default_factory=dict)
    output: str | None = None
    error: str | None = None
    session_id: str | None = None
    # Why the model's last turn ended ("length": cut at its output limit), kept with the
    # completed head so a replay reports it: Continue is offered on that alone.
    finish_reason: str | None = None
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    # Tool approval (webapp.runtime.approvals): the calls waiting for the user
    # ({"call_id", "may_have_run"}), the user's decisions (call_id -> "allow" |
    # "deny") and the calls of non-rerunnable tools that started (call ids).
    pending: list[dict[str, Any]] = field(default_factory=list)
    decisions: dict[str, str] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["usage"] = self.usage.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunHead:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["usage"] = Usage.from_dict(data.get("usage"))
        return cls(**values)


@dataclass(frozen=True)
class RunSnapshot:
    run_id: str
    entries: list[Entry]
    head: RunHead

    @property
    def status(self) -> RunStatus:
        return self.head.status


@runtime_checkable
class Checkpointer(Protocol):
    async def append(self, run_id: str, entries: list[Entry], head: RunHead) -> None:
        """Add the entries produced since the last call and replace the head."""
        ...

    async def load(self, run_id: str) -> RunSnapshot | None: ...

    async def delete(self, run_id: str) -> None: ...


class InMemoryCheckpointer(InMemoryStreamed):
    """Checkpoints in a dict: tests only -- it cannot survive the crash it is for."""

    def __init__(self) -> None:
        super().__init__()
        self._runs: dict[str, tuple[list[Entry], RunHead]] = {}

    async def append(self, run_id: str, entries: list[Entry], head: RunHead) -> None:
        stored = self._runs.get(run_id)
        saved = stored[0] if stored else []
        saved.extend(entries)
        # A copy, so a caller mutating its head (context_state) later cannot
        # change what was saved -- the SQLite store behaves the same way.
        self._runs[run_id] = (saved, RunHead.from_dict(head.to_dict()))

    async def load(self, run_id: str) -> RunSnapshot | None:
        stored = self._runs.get(run_id)
        if stored is None:
            return None
        return RunSnapshot(run_id, list(stored[0]), RunHead.from_dict(stored[1].to_dict()))

    async def delete(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        self.forget(run_id)
