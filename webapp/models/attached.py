"""A model sent what a user message's attachments hold: images as parts, documents as text.

The transcript's user entry records only which files came with it
(`webapp.transcript.Attachment`); `WithAttachments` resolves them, at every
model call, through a `FileContents` source (the chat layer's) into a
`SentUserEntry`, which `build_messages` turns into content parts. Built from
the entry alone, the request of a resumed or regenerated run is the request
of the first attempt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from webapp.runtime.model import Model, ModelPart, ModelRequest
from webapp.transcript import Attachment, Entry, UserEntry


@dataclass(frozen=True)
class SentFile:
    """One attachment as the model gets it: an image's data URL or a document's text."""

    attachment: Attachment
    image_url: str | None = None
    text: str | None = None  # whole, or its excerpts each headed "[NAME, page P]"


@dataclass(frozen=True)
class SentUserEntry(UserEntry):
    """A user entry with its files resolved: exists only inside a model request."""

    sent: tuple[SentFile, ...] = ()


class FileContents(Protocol):
    async def resolve(self, entry: UserEntry) -> tuple[SentFile, ...]: ...


def user_content(entry: UserEntry) -> str | list[dict[str, Any]]:
    """A user message's ``content``: its text, or parts when files came with it."""
    if not isinstance(entry, SentUserEntry) or not entry.sent:
        return entry.text
    parts: list[dict[str, Any]] = []
    if entry.text:
        parts.append({"type": "text", "text": entry.text})
    for file in entry.sent:
        if file.image_url is not None:
            parts.append({"type": "image_url", "image_url": {"url": file.image_url}})
        elif file.text is not None:
            parts.append({"type": "text", "text": file.text})
    return parts


@dataclass(frozen=True)
class WithAttachments:
    """A model whose requests carry each user message's files (`SentUserEntry`)."""

    model: Model
    files: FileContents

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        if any(isinstance(e, UserEntry) and e.attachments for e in request.entries):
            return self._with_files(request)
        return self.model.stream(request)  # no files: no layer for every part to cross

    async def _with_files(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        entries: list[Entry] = []
        for entry in request.entries:
            if isinstance(entry, UserEntry) and entry.attachments:
                sent = await self.files.resolve(entry)
                entry = SentUserEntry(entry.text, entry.attachments, sent)
            entries.append(entry)
        async for part in self.model.stream(replace(request, entries=entries)):
            yield part
