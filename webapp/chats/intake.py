"""A message's uploads judged, read and made ready to store, or refused naming the file.

`Intake.take` is what every way of attaching goes through (the composer, the
edit form, an import): the limits first (count, then each file's size, before
a byte is parsed), then each file read off the event loop
(`webapp.chats.file_worker`), then how its text goes to the model -- whole when
the text of all the message's documents fits `AttachmentLimits.context_chars`,
as excerpts otherwise (SPEC §14). Nothing is written here: the result goes
with the message's own transaction (`ChatStore.begin_run`), so a refusal
leaves no row behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace

from webapp.chats.attachments import FileStore, NewFile
from webapp.chats.file_reading import IMAGE_TYPES, Unreadable
from webapp.chats.file_worker import FileReader
from webapp.transcript import Attachment

MAX_NAME_CHARS = 255


@dataclass(frozen=True)
class AttachmentLimits:
    """``--max-attachment-mb``, the files per message, ``--max-pdf-pages`` and
    ``--attachment-context-chars``."""

    max_mb: float = 20
    max_files: int = 10
    max_pdf_pages: int = 2_000
    context_chars: int = 60_000

    def __post_init__(self) -> None:
        for name in ("max_mb", "max_files", "max_pdf_pages", "context_chars"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")

    @property
    def max_bytes(self) -> int:
        return int(self.max_mb * 1024 * 1024)


@dataclass(frozen=True)
class Upload:
    """A file as it arrived: its name (data, shown escaped) and its bytes."""

    name: str
    data: bytes


class AttachmentRefused(ValueError):
    """A file the message cannot take; the message names the file and the reason."""

    def __init__(self, name: str | None, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"{name!r} was not attached: {reason}." if name else reason + ".")


@dataclass(frozen=True)
class Taken:
    attachments: tuple[Attachment, ...] = ()
    files: tuple[NewFile, ...] = ()


class Intake:
    """Reads uploads under ``limits``; ``files`` tells the size of documents kept."""

    def __init__(
        self,
        files: FileStore,
        limits: AttachmentLimits | None = None,
        reader: FileReader | None = None,
    ) -> None:
        self.files = files
        self.limits = limits or AttachmentLimits()
        self.reader = reader or FileReader()

    async def take(self, uploads: Sequence[Upload], kept: Sequence[Attachment] = ()) -> Taken:
        """The message's attachments (``kept`` first, then ``uploads``) and the new files."""
        return await self.combine(kept, await self.read(uploads, len(kept)))

    async def read(self, uploads: Sequence[Upload], kept: int = 0) -> list[NewFile]:
        """Each upload checked against the limits (``kept`` files already go with the
        message), then read; `AttachmentRefused` for the first that cannot be taken."""
        limits = self.limits
        if len(uploads) + kept > limits.max_files:
            name = uploads[max(min(limits.max_files - kept, len(uploads) - 1), 0)].name
            raise AttachmentRefused(name, f"a message takes at most {limits.max_files} files")
        for upload in uploads:
            _check_name(upload.name)
            if len(upload.data) > limits.max_bytes:
                raise AttachmentRefused(
                    upload.name,
                    f"it is {len(upload.data):,} bytes; the limit is {limits.max_mb:g} MB",
                )
            if not upload.data:
                raise AttachmentRefused(upload.name, "it is empty")
        results = await asyncio.gather(*(self._read(u) for u in uploads), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [r for r in results if isinstance(r, NewFile)]

    async def combine(self, kept: Sequence[Attachment], new: Sequence[NewFile]) -> Taken:
        """``kept`` and ``new`` as one message's attachments, each document's ``context``
        set: "whole" when all their text fits the budget, "excerpts" otherwise."""
        if not kept and not new:
            return Taken()
        documents = [a.id for a in kept if a.media_type not in IMAGE_TYPES]
        sizes = await self.files.text_sizes(documents) if documents else {}
        total = sum(sizes.values()) + sum(len(f.text) for f in new if f.text is not None)
        context = "whole" if total <= self.limits.context_chars else "excerpts"

        def placed(a: Attachment) -> Attachment:
            return a if a.media_type in IMAGE_TYPES else replace(a, context=context)

        files = tuple(replace(f, attachment=placed(f.attachment)) for f in new)
        return Taken(tuple(placed(a) for a in kept) + tuple(f.attachment for f in files), files)

    async def _read(self, upload: Upload) -> NewFile:
        try:
            read = await self.reader.read(upload.data, self.limits.max_pdf_pages)
        except Unreadable as exc:
            raise AttachmentRefused(upload.name, str(exc)) from None
        found = read.found
        attachment = Attachment(read.digest, upload.name, found.media_type, len(upload.data))
        text = None if found.pages is None else found.text
        return NewFile(attachment, upload.data, text, read.chunks)


def _check_name(name: str) -> None:
    if not name.strip():
        raise AttachmentRefused(None, "A file without a name cannot be attached")
    if len(name) > MAX_NAME_CHARS:
        raise AttachmentRefused(
            name[:60] + "…", f"its name is longer than {MAX_NAME_CHARS} characters"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise AttachmentRefused(
            name.encode("unicode_escape").decode(), "its name holds control characters"
        )
