"""A run's events as its log: each record a fragment the web draws and the plain
change it shows, for this process's readers and (through the cluster) the others'.

The run's own task hands its events over as it emits them (`RunHandle.events_to`),
so no task wakes per token to take them. Text and reasoning deltas wait for the
end of that turn of the event loop: those of a burst become one record, and the
per-record work (its fragment, its readers' wake-up, its row for other processes)
is done once per burst. At a model's pace every token is a record of its own.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

from webapp.events import (
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnEnded,
    joined_deltas,
)
from webapp.stores.cluster import Cluster
from webapp.web.live.host import Renderer
from webapp.web.live.run_state import REASONING, TEXT, TOOL, RunState


class Recorder:
    """Appends records to runs' logs; ``fragments`` draws them."""

    def __init__(self, fragments: Renderer, cluster: Cluster) -> None:
        self.fragments = fragments
        self.cluster = cluster

    def take(self, state: RunState, event: Event) -> None:
        """An event as the run emits it: a delta waits for this turn of the event loop
        to end, anything else is recorded at once (after the deltas before it)."""
        if isinstance(event, (TextDelta, ReasoningDelta)):
            if not state.unrecorded:
                asyncio.get_running_loop().call_soon(self.flush, state)
            state.unrecorded.append(event)
            return
        self.flush(state)
        self._apply(state, event)

    def flush(self, state: RunState) -> None:
        """Record the deltas waiting, each run of text (or reasoning) as one record."""
        if state.unrecorded:
            deltas, state.unrecorded = state.unrecorded, []
            for event in joined_deltas(deltas):
                self._apply(state, event)

    def record(self, state: RunState, event: str, data: str, delta: dict[str, Any]) -> None:
        """Append a record to the run's log (and, for other processes, to the database):
        ``data`` as the web draws it, ``delta`` the plain change it shows."""
        state.append(event, data)
        self.cluster.write(state.run_id, state.epoch, state.seq, event, data, delta)

    def _apply(self, state: RunState, event: Event) -> None:
        reply, turns, draw = state.reply, state.new_turn, self.fragments
        if isinstance(event, TextDelta):
            added = reply.add_text(event.text, new_turn=TEXT in turns)
            turns.discard(TEXT)
            self.record(state, TEXT, draw.text(added), {"added": added})
        elif isinstance(event, ReasoningDelta):
            added = reply.add_reasoning(event.text, new_turn=REASONING in turns)
            turns.discard(REASONING)
            self.record(state, REASONING, draw.text(added), {"added": added})
        elif isinstance(event, ToolCallStarted):
            shown = reply.find_tool(event.call.call_id) is not None  # a resumed call's card
            card = reply.start_tool(event.call)
            self.record(state, TOOL, draw.tool_card(card, shown), {"tool": asdict(card)})
        elif isinstance(event, ToolCallFinished):
            card = reply.finish_tool(event.result)
            self.record(state, TOOL, draw.tool_card(card, True), {"tool": asdict(card)})
        elif isinstance(event, TurnEnded):
            turns.update((TEXT, REASONING))
