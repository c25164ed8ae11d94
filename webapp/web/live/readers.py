"""Who reads each run's log, so that a finished run's live state can go (SPEC §17).

`RunManager` kept each chat's last `RunState` -- its reply and one log record per
token -- until the chat was deleted: a process that had served many chats held
them all. Now a finished run's state goes `linger` seconds after its last
event stream closed (or after it finished, when none was open): long enough
for a page that reconnects at once to resume from the log, after which a page
reads the stored reply (`webapp.web.views.stream`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from webapp.web.live.run_state import RunState

LINGER_SECONDS = 10.0


class Readers:
    """The event streams reading each run's log now; calls ``forget`` for a finished
    run nobody has read for ``linger`` seconds (``forget`` decides whether it goes)."""

    def __init__(self, forget: Callable[[RunState], None], linger: float = LINGER_SECONDS) -> None:
        self._forget = forget
        self.linger = linger
        self._counts: dict[str, int] = {}  # run_id -> streams reading its log

    def reading(self, run_id: str) -> bool:
        return run_id in self._counts

    def came(self, state: RunState) -> None:
        self._counts[state.run_id] = self._counts.get(state.run_id, 0) + 1

    def left(self, state: RunState) -> None:
        count = self._counts.get(state.run_id, 1) - 1
        if count > 0:
            self._counts[state.run_id] = count
            return
        self._counts.pop(state.run_id, None)
        if state.finished:
            self.finished(state)

    def finished(self, state: RunState) -> None:
        """``state``'s run finished: unless read, it goes after ``linger`` seconds."""
        if state.run_id not in self._counts:
            asyncio.get_running_loop().call_later(self.linger, self._idle, state)

    def _idle(self, state: RunState) -> None:
        if state.run_id not in self._counts:
            self._forget(state)
