"""What of a message's files the model is sent: images as data URLs, documents whole or
as the excerpts most relevant to the message (SPEC §14).

`FileContext` is the `webapp.models.attached.FileContents` source of a chat
database. It reads only what the user entry records (each attachment's id and
``context``) and what is stored under those ids, so every attempt of a run --
the first, a resume after a crash, a regenerate -- is sent the same.
"""

from __future__ import annotations

import asyncio
import base64

from webapp.chats.attachments import FileStore
from webapp.chats.file_reading import IMAGE_TYPES
from webapp.models.attached import SentFile
from webapp.transcript import Attachment, UserEntry


def heading(attachment: Attachment, page: int | None = None) -> str:
    return f"[{attachment.name}]" if page is None else f"[{attachment.name}, page {page}]"


class FileContext:
    def __init__(self, files: FileStore, context_chars: int) -> None:
        self.files = files
        self.context_chars = context_chars  # the budget of a message's excerpts

    async def resolve(self, entry: UserEntry) -> tuple[SentFile, ...]:
        documents = [a for a in entry.attachments if a.media_type not in IMAGE_TYPES]
        whole = [a.id for a in documents if a.context != "excerpts"]
        texts = await self.files.texts(whole) if whole else {}
        by_excerpts = [a for a in documents if a.context == "excerpts"]
        picked: dict[str, str] = {}
        if by_excerpts:
            ids = list(dict.fromkeys(a.id for a in by_excerpts))
            found = await self.files.excerpts(ids, entry.text, self.context_chars)
            names = {a.id: a for a in by_excerpts}
            for excerpt in found:
                piece = heading(names[excerpt.file_id], excerpt.page) + "\n" + excerpt.text
                picked[excerpt.file_id] = (
                    picked[excerpt.file_id] + "\n\n" + piece if excerpt.file_id in picked else piece
                )
        sent: list[SentFile] = []
        for attachment in entry.attachments:
            if attachment.media_type in IMAGE_TYPES:
                sent.append(SentFile(attachment, image_url=await self._data_url(attachment)))
            elif attachment.context == "excerpts":
                text = picked.get(attachment.id, heading(attachment) + "\n(no passage matches)")
                sent.append(SentFile(attachment, text=text))
            else:
                text = texts.get(attachment.id, "")
                sent.append(SentFile(attachment, text=heading(attachment) + "\n" + text))
        return tuple(sent)

    async def _data_url(self, attachment: Attachment) -> str:
        data = await self.files.data(attachment.id) or b""
        encoded = await asyncio.to_thread(base64.b64encode, data)
        return f"data:{attachment.media_type};base64,{encoded.decode('ascii')}"
