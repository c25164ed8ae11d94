"""What the helpers of live runs need of the runs, and of each other: narrow protocols.

`webapp.web.live.runs` owns the runs of this process. Its helpers -- the paused
runs (`pauses`), the recovery of owed runs (`recovery`) and the lease keeper
(`lease_keeper`) -- each depend on the protocol here that names what they use,
never on the whole manager, so none of them imports `runs` and a helper can be
read (and tested) against what it is actually given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from webapp.chats.store import Chat, ChatStore
from webapp.runtime.agent import Agent
from webapp.runtime.options import CheckpointOptions
from webapp.stores.checkpoint import Checkpointer, RunSnapshot
from webapp.stores.cluster import Cluster
from webapp.stores.session import Session
from webapp.transcript import Entry
from webapp.web.live.reply import ReplyView, ToolCard
from webapp.web.live.run_state import RunState


class Renderer(Protocol):
    """What the runs ask of the web: the HTML their log records carry (`webapp.web.
    fragments.Fragments`). A run publishes plain changes; this draws them, once per
    record, for every reader of the log."""

    def text(self, text: str) -> str:
        """Streamed text (of the reply or its reasoning), escaped."""
        ...

    def tool_card(self, card: ToolCard, oob: bool) -> str: ...

    def reply(self, chat_id: str, reply: ReplyView, position: str | None = None) -> str: ...

    def final_reply(self, chat_id: str, reply: ReplyView) -> str: ...

    async def draw(self, replies: list[ReplyView]) -> None:
        """Draw what finished replies show beyond their text (their Markdown), off the
        event loop."""
        ...


class Resumer(Protocol):
    """What the paused runs need of recovery: a run's reply from its checkpoint, and
    the resume of a decided run (`webapp.web.live.recovery.Recovery`)."""

    async def reply_from_checkpoint(
        self, chat: Chat, run_id: str, entries: list[Entry]
    ) -> tuple[str, ReplyView]: ...

    async def resumable(
        self, chat: Chat, run_id: str, snapshot: RunSnapshot, epoch: str
    ) -> RunState: ...

    async def launch(self, state: RunState) -> None: ...


class Approvals(Protocol):
    """What recovery needs of the paused runs: the decisions copied into a checkpoint
    before it resumes, and the cards marked (`webapp.web.live.approvals.Pauses`)."""

    async def before_resume(self, run_id: str, snapshot: RunSnapshot) -> None: ...

    async def mark(self, run_id: str, reply: ReplyView, snapshot: RunSnapshot) -> None: ...


class RunHost(Protocol):
    """What the paused runs and recovery use of the runs of this process."""

    store: ChatStore
    session: Session
    checkpointer: Checkpointer
    cluster: Cluster
    redact: Callable[[str], str]

    @property
    def recovery(self) -> Resumer: ...

    @property
    def pauses(self) -> Approvals: ...

    def get(self, run_id: str) -> RunState | None: ...

    def lock(self, chat_id: str) -> contextlib.AbstractAsyncContextManager[None]: ...

    def next_epoch(self) -> str: ...

    def drop_follower(self, run_id: str) -> None:
        """This process resumes ``run_id`` itself: stop following another's attempt."""
        ...

    async def agent_for(self, chat_id: str) -> Agent: ...

    def new_state(
        self, chat_id: str, run_id: str, text: str, reply: ReplyView, epoch: str | None = None
    ) -> RunState: ...

    def continuing(
        self, chat_id: str, run_id: str, reply: ReplyView, epoch: str | None = None
    ) -> RunState: ...

    def launch(
        self, state: RunState, text: str | list[Entry], options: CheckpointOptions, session: Session
    ) -> None: ...

    async def stop_orphan(self, chat: Chat, run_id: str) -> None: ...

    async def store_ended(
        self,
        chat_id: str,
        run_id: str,
        entries: list[Entry],
        meta: dict[str, Any],
        continues: str | None = None,
    ) -> list[Entry]: ...


class LeaseHolder(Protocol):
    """What the lease keeper uses of the runs of this process."""

    def owned(self) -> dict[str, RunState]: ...

    def give_up(self, state: RunState) -> None: ...

    def stop_asked(self, run_id: str) -> None: ...

    def wake_followers(self, run_id: str) -> None: ...

    async def poll_followers(self, now: float) -> None: ...

    async def recover(self) -> int: ...
