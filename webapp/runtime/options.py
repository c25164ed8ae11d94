"""CheckpointOptions: how a run uses its checkpoint, and what an existing run_id means."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from webapp.errors import UserError
from webapp.stores.checkpoint import Checkpointer, RunSnapshot

IfRunExists = Literal["resume", "restart", "fail", "resume_only"]
_POLICIES = ("resume", "restart", "fail", "resume_only")


@dataclass(frozen=True)
class CheckpointOptions:
    """``run_id`` is the checkpoint's global key: generate it, never build it from user input."""

    checkpointer: Checkpointer
    run_id: str
    if_run_exists: IfRunExists = "resume"
    delete_on_success: bool = False
    resume_from: RunSnapshot | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not self.run_id:
            raise UserError(
                f"CheckpointOptions.run_id must be a non-empty string, got {self.run_id!r}"
            )
        if self.if_run_exists not in _POLICIES:
            raise UserError(
                f"if_run_exists={self.if_run_exists!r} is not a policy; use one of {_POLICIES}"
            )
        if self.resume_from is not None:
            if self.resume_from.run_id != self.run_id:
                raise UserError(
                    f"resume_from holds run {self.resume_from.run_id!r} but run_id is "
                    f"{self.run_id!r}; pass the snapshot's own run_id"
                )
            if self.if_run_exists in ("restart", "fail"):
                raise UserError(
                    f"resume_from cannot be combined with if_run_exists={self.if_run_exists!r}; "
                    "use 'resume' or 'resume_only'"
                )


async def existing_snapshot(options: CheckpointOptions | None) -> RunSnapshot | None:
    """The stored run the options continue, after ``if_run_exists`` had its say."""
    if options is None:
        return None
    snapshot = options.resume_from or await options.checkpointer.load(options.run_id)
    policy = options.if_run_exists
    if snapshot is None:
        if policy == "resume_only":
            raise UserError(
                f"no stored run {options.run_id!r} to resume; check the run_id or use "
                "if_run_exists='resume' to start a new run"
            )
        return None
    if policy == "fail":
        raise UserError(
            f"run {options.run_id!r} already exists ({snapshot.status}); generate a new "
            "run_id, or pass if_run_exists='resume' or 'restart'"
        )
    if policy == "restart":
        await options.checkpointer.delete(options.run_id)
        return None
    return snapshot
