"""The typed outcomes of the chat operations (`webapp.web.chat_service`).

Each operation returns one of these; views turn them into responses and never
decide with HTTP status integers (STYLE habit 12).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from webapp.chats.limits import LimitReached
from webapp.chats.store import Chat, Page
from webapp.web.live.run_state import RunState
from webapp.web.view_models import ReplyView


@dataclass(frozen=True)
class Started:
    chat: Chat
    run: RunState
    page: Page | None = None  # the chat's latest page, read as the run was recorded


@dataclass(frozen=True)
class AlreadySent:
    """This client message id was sent before: nothing new started."""

    chat: Chat


@dataclass(frozen=True)
class Busy:
    """A run is active in the chat."""

    chat: Chat


@dataclass(frozen=True)
class ChatNotFound:
    pass


@dataclass(frozen=True)
class MessageNotFound:
    chat: Chat


@dataclass(frozen=True)
class RunNotFound:
    chat: Chat


@dataclass(frozen=True)
class NothingToRegenerate:
    chat: Chat


@dataclass(frozen=True)
class ShownReply:
    """A reply as it now stands: after a stop, or read for a client that asks."""

    chat: Chat
    reply: ReplyView
    position: str | None  # set while it still streams (a stop that timed out)


@dataclass(frozen=True)
class Renamed:
    chat: Chat


@dataclass(frozen=True)
class Deleted:
    chat_id: str


@dataclass(frozen=True)
class Switched:
    chat: Chat


@dataclass(frozen=True)
class VersionNotFound:
    chat: Chat


@dataclass(frozen=True)
class Branched:
    chat: Chat  # the new chat


@dataclass(frozen=True)
class CannotContinue:
    """The reply was neither stopped nor cut at the model's output limit, or is not last."""

    chat: Chat


@dataclass(frozen=True)
class Imported:
    chat: Chat


@dataclass(frozen=True)
class BadChatFile:
    message: str


@dataclass(frozen=True)
class OverLimit:
    """The person may not start another reply now; nothing was written."""

    chat: Chat | None  # None: the first message of a chat, which was not made
    reached: LimitReached


SendOutcome = Union[Started, AlreadySent, Busy, ChatNotFound, OverLimit]
NewChatOutcome = Union[Started, AlreadySent, OverLimit]
EditOutcome = Union[Started, Busy, ChatNotFound, MessageNotFound, OverLimit]
RegenerateOutcome = Union[
    Started, Busy, ChatNotFound, MessageNotFound, NothingToRegenerate, OverLimit
]
ContinueOutcome = Union[Started, Busy, ChatNotFound, RunNotFound, CannotContinue, OverLimit]
SwitchOutcome = Union[Switched, Busy, ChatNotFound, VersionNotFound]
BranchOutcome = Union[Branched, Busy, ChatNotFound, RunNotFound]
StopOutcome = Union[ShownReply, ChatNotFound, RunNotFound]
DecideOutcome = Union[ShownReply, ChatNotFound, RunNotFound]
RenameOutcome = Union[Renamed, ChatNotFound]
DeleteOutcome = Union[Deleted, ChatNotFound]
