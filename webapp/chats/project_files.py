"""Project files (SPEC §15): documents of §14 that every chat of a project draws on.

A project's files are rows of ``project_files`` naming files of the attachment
tables (`webapp.chats.attachments`: stored once per content hash, their text
in chunks under the full-text index). Invariants, named for the failure they
prevent:
- a file row stays while a chat's message or a project names it, and goes
  with the last of them (`attachments.free_unused` checks both): a project
  never loses a file a chat still shows, nor keeps one nobody names;
- only documents (text the model can read): an image has no text to send;
- the files are written in one transaction with their project row checked
  for its owner: nothing is stored for a project that is not the person's;
- what the model is sent is read at each model call from what the project
  holds then (`ProjectFileContext`): a file added or removed counts from the
  next step on, as the project's instructions do.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from webapp.chats import attachments
from webapp.chats.attachments import FileStore, NewFile
from webapp.chats.db import ChatDatabase, Tx
from webapp.chats.file_context import heading
from webapp.chats.users import Owner
from webapp.transcript import Attachment, Entry, UserEntry

SCHEMA = """
CREATE TABLE IF NOT EXISTS project_files (
    project_id TEXT NOT NULL,
    file_id TEXT NOT NULL,
    name TEXT NOT NULL,
    media_type TEXT NOT NULL,
    size INTEGER NOT NULL,
    added_at REAL NOT NULL,
    PRIMARY KEY (project_id, file_id, name)
);
CREATE INDEX IF NOT EXISTS project_files_by_file ON project_files (file_id);
"""
POSTGRES_SCHEMA = SCHEMA.replace(" REAL ", " DOUBLE PRECISION ")
INTRODUCTION = (
    "Project files: documents of the project this chat belongs to, whole or as the "
    "passages most relevant to the latest message, each headed with its name."
)


async def _owned(tx: Tx, owner: Owner, project_id: str) -> bool:
    where, params = owner.condition()
    return bool(
        await tx.fetch(f"SELECT 1 FROM projects WHERE id = ?{where}", (project_id, *params))
    )


@dataclass(frozen=True)
class ProjectFile:
    file_id: str
    name: str
    media_type: str
    size: int

    def attachment(self) -> Attachment:
        return Attachment(self.file_id, self.name, self.media_type, self.size)


def _file(row: Sequence[object]) -> ProjectFile:
    return ProjectFile(str(row[0]), str(row[1]), str(row[2]), int(str(row[3])))


async def files_of(tx: Tx, project_id: str) -> list[ProjectFile]:
    rows = await tx.fetch(
        "SELECT file_id, name, media_type, size FROM project_files WHERE project_id = ? "
        "ORDER BY added_at, name",
        (project_id,),
    )
    return [_file(r) for r in rows]


async def forget_project(tx: Tx, project_id: str) -> None:
    """Take the project's files out, and the file rows nobody names any more."""
    rows = await tx.fetch(
        "SELECT DISTINCT file_id FROM project_files WHERE project_id = ?", (project_id,)
    )
    await tx.execute("DELETE FROM project_files WHERE project_id = ?", (project_id,))
    for (file_id,) in rows:
        await attachments.free_unused(tx, str(file_id))


class ProjectFiles:
    """The project files' reads and writes, on the chat database."""

    def __init__(self, db: ChatDatabase) -> None:
        self._db = db

    async def of(self, owner: Owner, project_id: str) -> list[ProjectFile]:
        async def select(tx: Tx) -> list[ProjectFile]:
            if not await _owned(tx, owner, project_id):
                return []
            return await files_of(tx, project_id)

        return await self._db.read(select)

    async def add(self, owner: Owner, project_id: str, files: Sequence[NewFile]) -> bool:
        """Store ``files`` (each content once) as the project's; False if the project is
        not ``owner``'s (nothing is written)."""
        now = time.time()

        async def write(tx: Tx) -> bool:
            if not await _owned(tx, owner, project_id):
                return False
            await attachments.store_new(tx, files)
            await tx.executemany(
                "INSERT INTO project_files (project_id, file_id, name, media_type, size, "
                "added_at) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (project_id, file_id, name) DO NOTHING",
                [
                    (project_id, a.id, a.name, a.media_type, a.size, now)
                    for a in (f.attachment for f in files)
                ],
            )
            return True

        return await self._db.write(write)

    async def remove(self, owner: Owner, project_id: str, file_id: str, name: str) -> bool:
        async def write(tx: Tx) -> bool:
            if not await _owned(tx, owner, project_id):
                return False
            removed = await tx.execute(
                "DELETE FROM project_files WHERE project_id = ? AND file_id = ? AND name = ?",
                (project_id, file_id, name),
            )
            await attachments.free_unused(tx, file_id)
            return removed > 0

        return await self._db.write(write)

    async def of_chat(self, chat_id: str) -> list[ProjectFile]:
        """The files of the project ``chat_id`` is in (none outside projects)."""

        async def select(tx: Tx) -> list[ProjectFile]:
            rows = await tx.fetch(
                "SELECT f.file_id, f.name, f.media_type, f.size FROM chats c "
                "JOIN project_files f ON f.project_id = c.project_id WHERE c.id = ? "
                "ORDER BY f.added_at, f.name",
                (chat_id,),
            )
            return [_file(r) for r in rows]

        return await self._db.read(select)


class ProjectFileContext:
    """What of a chat's project files a model call is sent (`webapp.models.with_context`):
    every document whole when their text fits ``budget`` characters, else the passages
    most relevant to the latest user message, in document order, each headed
    ``[NAME, page P]`` -- §14's rule, over the project's documents."""

    def __init__(self, files: FileStore, projects: ProjectFiles, chat_id: str, budget: int) -> None:
        self.files = files
        self.projects = projects
        self.chat_id = chat_id
        self.budget = budget

    async def for_request(self, entries: Sequence[Entry]) -> str:
        documents = await self.projects.of_chat(self.chat_id)
        sizes = await self.files.text_sizes([f.file_id for f in documents])
        documents = [f for f in documents if f.file_id in sizes]
        if not documents:
            return ""
        pieces: list[str] = []
        if sum(sizes.values()) <= self.budget:  # each content once, however many names
            texts = await self.files.texts([f.file_id for f in documents])
            pieces = [heading(f.attachment()) + "\n" + texts.get(f.file_id, "") for f in documents]
        else:
            latest = next((e.text for e in reversed(entries) if isinstance(e, UserEntry)), "")
            ids = list(dict.fromkeys(f.file_id for f in documents))
            names = {f.file_id: f for f in reversed(documents)}
            for excerpt in await self.files.excerpts(ids, latest, self.budget):
                pieces.append(
                    heading(names[excerpt.file_id].attachment(), excerpt.page) + "\n" + excerpt.text
                )
        if not pieces:
            return ""
        return INTRODUCTION + "\n\n" + "\n\n".join(pieces)
