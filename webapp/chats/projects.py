"""Projects (SPEC §15): a person's chats kept together, with instructions of their own.

A project is a row of ``projects``; a chat is in at most one, by its
``project_id``. Invariants, named for the failure they prevent:
- every read and write filters by the `Owner`, as the chats do (§13): another
  person's project is not found, exactly as one that does not exist;
- a chat moves only into a project of its own owner: a forged form cannot
  put one person's chat into another's project (or the reverse);
- deleting a project moves its chats out in the same transaction: no chat is
  ever lost with a project, nor left pointing at one that is gone;
- the project's instructions are read at each run's start and resume
  (`instructions_for`), so they apply from the next step on, as a chat's own.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from webapp.chats import project_files
from webapp.chats.db import ChatDatabase, Tx
from webapp.chats.library import CHAT_COLUMNS, Chat, chat_from_row, owns
from webapp.chats.users import Owner

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS projects (
    id TEXT PRIMARY KEY,
    user_id TEXT,
    name TEXT NOT NULL,
    instructions TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS projects_by_user ON projects (user_id, name);
ALTER TABLE chats ADD COLUMN project_id TEXT;
CREATE INDEX IF NOT EXISTS chats_by_project ON chats (project_id, updated_at DESC);
"""
    + project_files.SCHEMA
)
POSTGRES_SCHEMA = SCHEMA.replace(" REAL", " DOUBLE PRECISION").replace(
    "ADD COLUMN project_id", "ADD COLUMN IF NOT EXISTS project_id"
)

MAX_NAME_CHARS = 200
MAX_INSTRUCTIONS_CHARS = 20_000
_COLUMNS = "id, name, instructions, created_at"


class ProjectNameError(ValueError):
    """A project name that is empty or too long."""


@dataclass(frozen=True)
class Project:
    id: str
    name: str
    instructions: str
    created_at: float


def _project(row: Any) -> Project:
    return Project(str(row[0]), str(row[1]), str(row[2] or ""), float(row[3]))


def project_name(raw: str) -> str:
    """``raw`` as a project name (one line, trimmed), or `ProjectNameError` saying why not."""
    name = " ".join(raw.split())
    if not name:
        raise ProjectNameError("A project needs a name: type one in Project name.")
    if len(name) > MAX_NAME_CHARS:
        raise ProjectNameError(
            f"The project name is {len(name):,} characters long; the limit is {MAX_NAME_CHARS}."
        )
    return name


async def owned_project(tx: Tx, owner: Owner, project_id: str) -> Project | None:
    where, params = owner.condition()
    rows = await tx.fetch(
        f"SELECT {_COLUMNS} FROM projects WHERE id = ?{where}", (project_id, *params)
    )
    return _project(rows[0]) if rows else None


class Projects:
    """The projects' reads and writes, on the chat database."""

    def __init__(self, db: ChatDatabase) -> None:
        self._db = db

    async def create(self, owner: Owner, name: str) -> Project:
        project = Project(uuid.uuid4().hex, project_name(name), "", time.time())
        await self._db.write(
            lambda tx: tx.execute(
                "INSERT INTO projects (id, user_id, name, instructions, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (project.id, owner.user_id, project.name, "", project.created_at),
            )
        )
        return project

    async def of(self, owner: Owner) -> list[Project]:
        """``owner``'s projects, by name."""
        where, params = owner.condition()
        sql = f"SELECT {_COLUMNS} FROM projects WHERE 1 = 1{where} ORDER BY name, id"

        async def select(tx: Tx) -> list[Project]:
            return [_project(r) for r in await tx.fetch(sql, params)]

        return await self._db.read(select)

    async def get(self, owner: Owner, project_id: str) -> Project | None:
        return await self._db.read(lambda tx: owned_project(tx, owner, project_id))

    async def chats(self, owner: Owner, project_id: str) -> list[Chat]:
        """The project's chats, most recently updated first."""
        where, params = owner.condition()

        async def select(tx: Tx) -> list[Chat]:
            rows = await tx.fetch(
                f"SELECT {CHAT_COLUMNS} FROM chats WHERE project_id = ?{where} "
                "ORDER BY updated_at DESC, id",
                (project_id, *params),
            )
            return [chat_from_row(r) for r in rows]

        return await self._db.read(select)

    async def rename(self, owner: Owner, project_id: str, name: str) -> bool:
        clean = project_name(name)
        where, params = owner.condition()
        sql = f"UPDATE projects SET name = ? WHERE id = ?{where}"
        return await self._db.write(lambda tx: tx.execute(sql, (clean, project_id, *params))) > 0

    async def instruct(self, owner: Owner, project_id: str, instructions: str) -> bool:
        if len(instructions) > MAX_INSTRUCTIONS_CHARS:
            raise ValueError(
                f"The instructions are {len(instructions):,} characters long; the limit is "
                f"{MAX_INSTRUCTIONS_CHARS:,}."
            )
        where, params = owner.condition()
        sql = f"UPDATE projects SET instructions = ? WHERE id = ?{where}"
        return (
            await self._db.write(lambda tx: tx.execute(sql, (instructions, project_id, *params)))
            > 0
        )

    async def delete(self, owner: Owner, project_id: str) -> bool:
        """Delete the project; its chats stay, moved out of it, and its files go unless a
        chat holds them too (one transaction)."""

        async def remove(tx: Tx) -> bool:
            if await owned_project(tx, owner, project_id) is None:
                return False
            await tx.execute(
                "UPDATE chats SET project_id = NULL WHERE project_id = ?", (project_id,)
            )
            await project_files.forget_project(tx, project_id)  # its files, unless a chat's
            return await tx.execute("DELETE FROM projects WHERE id = ?", (project_id,)) > 0

        return await self._db.write(remove)

    async def move(self, owner: Owner, chat_id: str, project_id: str | None) -> bool:
        """Put ``chat_id`` into ``project_id`` (None: out of every project). False if the
        chat or the project is not ``owner``'s (nothing changes)."""

        async def write(tx: Tx) -> bool:
            if not await owns(tx, owner, chat_id):
                return False
            if project_id is not None and await owned_project(tx, owner, project_id) is None:
                return False
            await tx.execute("UPDATE chats SET project_id = ? WHERE id = ?", (project_id, chat_id))
            return True

        return await self._db.write(write)

    async def project_of(self, chat_id: str) -> Project | None:
        """The project ``chat_id`` is in, if any (the chat's owner's, as `move` ensures)."""

        rows = await self._db.fetch(
            "SELECT p.id, p.name, p.instructions, p.created_at FROM chats c "
            "JOIN projects p ON p.id = c.project_id WHERE c.id = ?",
            (chat_id,),
        )
        return _project(rows[0]) if rows else None
