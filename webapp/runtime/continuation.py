"""Continuing an unfinished reply, and what a finished run records for it.

A run with no input whose history ends with assistant text is a
*continuation*: its first model call is asked to extend that text, not to
answer again (`ModelRequest.continue_final`). Nothing else marks such a run.
Its checkpoint and its session segment simply start without a UserEntry, and
a resume recognises it the same way, so a crashed continuation resumes as a
continuation instead of answering the user's message a second time.

A finished run's segment meta records ``"finish_reason": "length"`` when the
model stopped at its output limit: that is the only durable trace of a cut
reply, and without it a reload could not offer to continue it. Other finish
reasons record nothing, so ordinary segments keep the meta they always had.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webapp.transcript import AssistantEntry, Entry

CUT_BY_LIMIT = "length"


def continues_final(own: Sequence[Entry], view: Sequence[Entry]) -> bool:
    """Whether the next model call continues the final assistant text of `view`.

    `own` is what the run holds of its own: only a run that has neither input
    nor output yet continues; once it has produced something, the model view
    ends with that, and later turns are ordinary ones.
    """
    return not own and bool(view) and isinstance(view[-1], AssistantEntry)


def segment_meta(
    context_state: Mapping[str, Any], finish_reason: str | None
) -> dict[str, Any] | None:
    """The meta of a finished run's session segment (None when there is nothing to say)."""
    meta: dict[str, Any] = {}
    if context_state:
        meta["context_state"] = dict(context_state)
    if finish_reason == CUT_BY_LIMIT:
        meta["finish_reason"] = CUT_BY_LIMIT
    return meta or None
