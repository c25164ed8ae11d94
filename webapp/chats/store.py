"""The chats table: titles, times and the run in flight, next to the session data.

A chat's conversation lives in the Session (session_id = chat id) and the run
in flight in its checkpoint; this table adds what only the web app needs:
- ``active_run_id`` -- the run the server owes the chat. It is set before the
  run starts and cleared only after the run's outcome is durable in the
  session, so a restart always knows which checkpoint to resume;
- ``stop_requested_run_id`` -- written before a Stop cancels the run, so a
  crash in the middle of a stop finishes the stop on restart instead of
  resuming a run the user stopped;
- the ``sends`` table maps (chat, client message id) to the run it started,
  so a retried POST or a double click never starts a second run.

The file is the app's own, so deleting a chat removes its session segments
and run checkpoints here too, in the same transaction as its row: a crash
can never leave half a chat behind. `sweep` removes what older versions
could leave (segments or checkpoints with no chat to own them).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Self

from webapp.chats import api_access, attachments, sharing, tool_approvals
from webapp.chats import limits as chat_limits
from webapp.chats import search as chat_search
from webapp.chats import search_pg as chat_search_pg
from webapp.chats import settings as chat_settings
from webapp.chats import tree as chat_tree
from webapp.chats import users as chat_users
from webapp.chats.attachments import NewFile
from webapp.chats.db import CLUSTER_TABLES, POSTGRES_STORES, SQLITE_STORES, Tx, open_chat_db
from webapp.chats.library import CHAT_COLUMNS as _COLUMNS
from webapp.chats.library import CHECKPOINT_TABLES as _CHECKPOINT_TABLES
from webapp.chats.library import Chat, ChatLibrary, owns
from webapp.chats.library import chat_from_row as _chat
from webapp.chats.library import delete_checkpoints as _delete_checkpoints
from webapp.chats.limits import Limits
from webapp.chats.pages import Page, read_page
from webapp.chats.session_rows import append_segments, cut_segments, shown_segment, stored_segments
from webapp.chats.tree import Tree
from webapp.chats.users import EVERY_CHAT, Owner, ThrottlePolicy, Users
from webapp.stores import streamed
from webapp.stores.codec import StoredSegment
from webapp.stores.session import Segment
from webapp.transcript import Attachment, Entry

__all__ = [
    "EVERY_CHAT",
    "AlreadySentError",
    "Begun",
    "Chat",
    "ChatBusyError",
    "ChatStore",
    "NewRun",
    "Owner",
    "Page",
]

_RUN_INPUTS = """
CREATE TABLE IF NOT EXISTS run_inputs (
    run_id TEXT PRIMARY KEY,
    chat_id TEXT NOT NULL,
    input TEXT NOT NULL
);
"""

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS chats (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    active_run_id TEXT,
    stop_requested_run_id TEXT,
    continues_run_id TEXT
);
CREATE INDEX IF NOT EXISTS chats_by_update ON chats (updated_at DESC);
CREATE TABLE IF NOT EXISTS sends (
    chat_id TEXT NOT NULL,
    client_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (chat_id, client_id)
);
CREATE INDEX IF NOT EXISTS sends_by_client ON sends (client_id);
"""
    + _RUN_INPUTS
)

_SETTINGS = chat_settings.SCHEMA + chat_settings.RUN_SCHEMA


class ChatBusyError(RuntimeError):
    """A run is already active in the chat: the database refused to start another."""


class AlreadySentError(RuntimeError):
    """The client message id already started a run in the chat: nothing new starts."""


NewRunKind = Literal["send", "edit", "regenerate", "continue"]


@dataclass(frozen=True)
class ShownRun:
    """One run of the shown path: its segment, whether the path ends with it, and the
    part of the tree its switchers need."""

    segment: Segment
    last: bool
    tree: Tree


@dataclass(frozen=True)
class Begun:
    """A run's record, as its transaction left the chat: the chat's row (its active run
    and title set), and the latest page if one was asked for."""

    chat: Chat
    page: Page | None = None


@dataclass(frozen=True)
class NewRun:
    """A run about to start, and where it goes in the chat's tree.

    ``send`` follows the shown path; ``edit`` and ``regenerate`` make a new
    version beside ``target`` (archiving ``target`` and what follows it);
    ``continue`` adds no node: its text joins ``target``'s reply.
    """

    run_id: str
    kind: NewRunKind = "send"
    target: str | None = None
    client_id: str | None = None
    title: str | None = None  # the chat's title if it has none yet
    rename: str | None = None  # a new title regardless (the first message was edited)
    input: str | None = None  # the user's text it starts from, kept while it is in flight
    model: str | None = None  # the endpoint/model it runs with (a continuation: unused)
    owner: Owner = field(kw_only=True)  # whose chat it must be, and whose limits it counts in
    # What the message brings (SPEC §14): every attachment, and the files among them
    # that were just uploaded, stored in the run's own transaction.
    attachments: tuple[Attachment, ...] = field(default=(), kw_only=True)
    files: tuple[NewFile, ...] = field(default=(), kw_only=True)


class ChatStore(ChatLibrary):
    """The chat tables, in the app's SQLite file or its PostgreSQL database.

    ``location`` is the SQLite file (WAL: it is shared with the session and
    checkpoint stores) or a ``postgresql://`` URL. Either way the session's and
    the checkpoints' tables are in the same database, and the transactions here
    span them (the search index's triggers watch them too). ``users``: the
    people tables of the same database (failed sign-ins slowed by ``throttle``);
    ``limits``: what `begin_run` admits.

    A method a person's request reaches takes the `Owner` it acts for (the
    library half, `ChatLibrary`, and the versions here) and finds nothing of
    anyone else's. The bookkeeping of runs in flight (`end_run`, `request_stop`
    ...) does not: it acts on runs an owned `begin_run` recorded.
    """

    SCHEMA_NAME = "webapp_chats"
    SCHEMA_VERSION = 15
    SCHEMA_SQL = (
        SQLITE_STORES
        + _SCHEMA
        + chat_tree.SCHEMA
        + chat_search.SCHEMA
        + _SETTINGS
        + tool_approvals.SCHEMA
        + chat_users.SQLITE_SCHEMA
        + api_access.SCHEMA
        + attachments.SQLITE_SCHEMA
        + sharing.SCHEMA
    )
    MIGRATIONS: ClassVar[Mapping[int, str]] = {
        1: "CREATE INDEX IF NOT EXISTS sends_by_client ON sends (client_id);",
        # Versions: the tree's table; chats stored before it are backfilled at start-up.
        2: "ALTER TABLE chats ADD COLUMN continues_run_id TEXT;\n" + chat_tree.SCHEMA,
        # Search: the index and its triggers, filled from what is stored.
        3: SQLITE_STORES + chat_search.SCHEMA + chat_search.REBUILD,
        # Pages of long chats read their switchers' runs by parent.
        4: "CREATE INDEX IF NOT EXISTS chat_runs_by_parent ON chat_runs (chat_id, parent_run_id);",
        # A crash before a run's first checkpoint restarts it from its input.
        5: _RUN_INPUTS,
        # Search keeps the text after a NUL, and no text holds the excerpt markers.
        6: SQLITE_STORES + chat_search.REINDEX,
        7: chat_settings.SCHEMA,  # a chat's own model, instructions and parameters
        8: chat_settings.RUN_SCHEMA,  # each run's model and usage
        9: tool_approvals.SCHEMA,  # tools that ask first: decisions, grants, waiting runs
        # People: every chat gets an owner; accounts, sessions, failed sign-ins.
        10: chat_users.SQLITE_SCHEMA,
        11: streamed.TABLE_SQL,  # the streamed text of a turn in flight
        12: api_access.SCHEMA,  # the API's keys and the runs programs started (SPEC §16)
        13: attachments.SQLITE_SCHEMA,  # attached files, their text's index, who holds them
        14: sharing.SCHEMA,  # share links and projects (SPEC §15)
    }
    # PostgreSQL started with everything above but run_inputs (its own numbering).
    POSTGRES_SCHEMA_VERSION = 12
    POSTGRES_MIGRATIONS: ClassVar[Mapping[int, str]] = {
        1: _RUN_INPUTS,
        2: chat_search_pg.SCHEMA + chat_search_pg.REBUILD,  # no text holds the markers
        3: chat_settings.POSTGRES_SCHEMA,
        4: chat_settings.POSTGRES_RUN_SCHEMA,
        5: tool_approvals.POSTGRES_SCHEMA,
        6: chat_users.POSTGRES_SCHEMA,
        7: chat_settings.POSTGRES_BIGINT_USAGE,  # usage past 2^31 fits (SPEC §17)
        8: streamed.TABLE_SQL,  # the streamed text of a turn in flight
        9: api_access.POSTGRES_SCHEMA,  # the API's keys and runs (SPEC §16)
        10: attachments.POSTGRES_SCHEMA,  # attached files (SPEC §14)
        11: sharing.POSTGRES_SCHEMA,  # share links and projects (SPEC §15)
    }
    POSTGRES_SCHEMA_SQL = (
        POSTGRES_STORES
        + _SCHEMA.replace(" REAL ", " DOUBLE PRECISION ")
        + chat_tree.SCHEMA
        + chat_search_pg.SCHEMA
        + CLUSTER_TABLES
        + chat_settings.POSTGRES_SCHEMA
        + chat_settings.POSTGRES_RUN_SCHEMA
        + tool_approvals.POSTGRES_SCHEMA
        + chat_users.POSTGRES_SCHEMA
        + api_access.POSTGRES_SCHEMA
        + attachments.POSTGRES_SCHEMA
        + sharing.POSTGRES_SCHEMA
    )

    def __init__(
        self,
        location: str | os.PathLike[str],
        *,
        limits: Limits | None = None,
        throttle: ThrottlePolicy | None = None,
        max_connections: int = 10,  # on PostgreSQL (--db-pool-size shares them out)
    ) -> None:
        self._store = open_chat_db(
            location,
            max_connections=max_connections,
            sqlite_schema=(self.SCHEMA_NAME, self.SCHEMA_VERSION, self.SCHEMA_SQL, self.MIGRATIONS),
            postgres_schema=(
                self.SCHEMA_NAME,
                self.POSTGRES_SCHEMA_VERSION,
                self.POSTGRES_SCHEMA_SQL,
                self.POSTGRES_MIGRATIONS,
            ),
        )
        self.dialect = self._store.dialect
        self.settings = chat_settings.SettingsStore(self._store)
        self.approvals = tool_approvals.ToolApprovals(self._store)
        self.users = Users(self._store, throttle)
        self.api_keys = api_access.ApiKeys(self._store)
        self.api_runs = api_access.ApiRuns(self._store)
        self.files = attachments.FileStore(self._store)
        self.shares = sharing.Shares(self._store)
        self.projects = sharing.Projects(self._store)
        self.project_files = sharing.ProjectFiles(self._store)
        self.limits = limits or Limits()

    async def close(self) -> None:
        await self._store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def with_active_run(self) -> list[Chat]:
        async def select(tx: Tx) -> list[Chat]:
            rows = await tx.fetch(f"SELECT {_COLUMNS} FROM chats WHERE active_run_id IS NOT NULL")
            return [_chat(r) for r in rows]

        return await self._store.read(select)

    async def ping(self) -> None:
        """One trivial read: raises when the database does not answer (``/readyz``)."""

        async def select(tx: Tx) -> None:
            await tx.fetch("SELECT 1")

        await self._store.read(select)

    async def sweep(self) -> int:
        """Delete segments of chats that no longer exist and checkpoints no chat owes;
        returns how many rows went. Only safe before any run starts (at start-up)."""

        async def remove(tx: Tx) -> int:
            removed = 0
            for statement in (
                "DELETE FROM chat_runs WHERE chat_id NOT IN (SELECT id FROM chats)",
                "DELETE FROM session_segments WHERE session_id NOT IN (SELECT id FROM chats)",
                *(
                    f"DELETE FROM {table} WHERE run_id NOT IN (SELECT active_run_id "
                    "FROM chats WHERE active_run_id IS NOT NULL)"
                    for table in _CHECKPOINT_TABLES
                ),
            ):
                removed += await tx.execute(statement)
            return removed

        return await self._store.write(remove)

    async def begin_run(
        self,
        chat_id: str,
        new: NewRun,
        *,
        page: int | None = None,
    ) -> Begun:
        """Record the run in flight in one transaction: its place in the tree (with the
        versions it replaces archived and their checkpoints gone), the client id that
        asked, and the chat's active run. Raises `AlreadySentError` when the client id
        started a run before, `ChatBusyError` when the chat already has an active run
        or is not ``new.owner``'s, and `LimitReached` when the owner may not start
        another run now (writing nothing in any case): the database decides.

        Returns the chat's row as the transaction left it and, with ``page``, its latest
        page of that many runs, with the new run's node (`page`'s ``also``): what the
        answer to the request shows, without another trip to the database."""
        now = time.time()

        async def begin(tx: Tx) -> Begun:
            if not await owns(tx, new.owner, chat_id):
                raise ChatBusyError(chat_id)  # someone else's chat: as if there were none
            await chat_limits.admit(tx, self.limits, new.owner, chat_id, now)
            if new.client_id is not None and not await tx.execute(
                "INSERT INTO sends (chat_id, client_id, run_id, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (chat_id, client_id) DO NOTHING",
                (chat_id, new.client_id, new.run_id, now),
            ):
                raise AlreadySentError(chat_id)  # a retried POST or a double click
            run, model = new.run_id, new.model
            if new.kind == "send":
                parent = await chat_tree.path_end(tx, chat_id)
                await chat_tree.add_node(tx, chat_id, run, parent, run, model=model)
            elif new.kind in ("edit", "regenerate") and new.target is not None:
                node = await chat_tree.find(tx, chat_id, new.target)
                if node is None:
                    raise LookupError(f"run {new.target!r} is not in chat {chat_id!r}'s tree")
                archived = await chat_tree.archive_from(tx, chat_id, new.target)
                await _delete_checkpoints(tx, archived)
                message = run if new.kind == "edit" else node.message_id
                await chat_tree.add_node(tx, chat_id, run, node.parent_run_id, message, model=model)
            if new.input is not None:
                await tx.execute(
                    "INSERT INTO run_inputs (run_id, chat_id, input) VALUES (?, ?, ?)",
                    (new.run_id, chat_id, new.input),
                )
            if new.attachments:
                await attachments.store_files(tx, chat_id, run, new.attachments, new.files)
            title = new.rename or new.title
            started = await tx.execute(
                "UPDATE chats SET active_run_id = ?, stop_requested_run_id = NULL, "
                "continues_run_id = ?, updated_at = ?, title = CASE WHEN "
                "CAST(? AS TEXT) IS NOT NULL AND (title = '' OR ?) THEN ? ELSE title END "
                "WHERE id = ? AND active_run_id IS NULL",
                (
                    new.run_id,
                    new.target if new.kind == "continue" else None,
                    now,
                    title,
                    new.rename is not None,
                    title,
                    chat_id,
                ),
            )
            if not started:  # another run began first (maybe in another process), or no chat
                raise ChatBusyError(chat_id)
            rows = await tx.fetch(f"SELECT {_COLUMNS} FROM chats WHERE id = ?", (chat_id,))
            if page is None:
                return Begun(_chat(rows[0]))
            return Begun(_chat(rows[0]), await read_page(tx, chat_id, None, page, [new.run_id]))

        return await self._store.write(begin)

    async def admits(self, owner: Owner) -> None:
        """Raise `LimitReached` if ``owner`` may not start a run now (a look: no write)."""
        if not self.limits.any:
            return
        now = time.time()
        await self._store.read(lambda tx: chat_limits.admit(tx, self.limits, owner, "", now))

    async def page(
        self, owner: Owner, chat_id: str, *, before: str | None, limit: int, also: list[str]
    ) -> Page | None:
        """The shown path's last ``limit`` runs before run ``before`` (the end for None),
        and the part of the tree they (and the runs ``also``) need; None when ``before``
        is not on the path. Reads one page, however long the chat."""

        async def read(tx: Tx) -> Page | None:
            if not await owns(tx, owner, chat_id):
                return None
            return await read_page(tx, chat_id, before, limit, also)

        return await self._store.read(read)

    async def shown_run(self, owner: Owner, chat_id: str, run_id: str) -> ShownRun | None:
        """Run ``run_id`` if it is on the shown path (None if not): a few indexed reads,
        however long the chat, so a lookup of an unknown id costs as little as a known."""

        async def select(tx: Tx) -> ShownRun | None:
            found = (
                await shown_segment(tx, chat_id, run_id) if await owns(tx, owner, chat_id) else None
            )
            if found is None:
                return None
            tree = await chat_tree.load_around(tx, chat_id, [run_id])
            return ShownRun(found[0].decode(chat_id), found[1], tree)

        return await self._store.read(select)

    async def tree_around(self, chat_id: str, run_ids: list[str]) -> Tree:
        """The runs ``run_ids`` and those beside them: enough for their switchers (for a
        run the server just recorded)."""
        if not run_ids:
            return Tree([])
        return chat_tree.tree_of(await self._store.fetch(*chat_tree.around(chat_id, run_ids)))

    async def tree(self, owner: Owner, chat_id: str) -> Tree:
        async def read(tx: Tx) -> Tree:
            owned = await owns(tx, owner, chat_id)
            return await chat_tree.load_tree(tx, chat_id) if owned else Tree([])

        return await self._store.read(read)

    async def switch(self, owner: Owner, chat_id: str, run_id: str) -> bool:
        """Show version ``run_id``: the path from its parent on is replaced by its own
        (with the versions below it as they were last selected). No model is called.
        False: not ``owner``'s chat, or no such version in it (nothing changed)."""

        async def move(tx: Tx) -> bool:
            tree = await chat_tree.load_tree(tx, chat_id)
            if run_id not in tree.nodes or not await owns(tx, owner, chat_id):
                return False
            parent = tree.nodes[run_id].parent_run_id
            shown = tree.chosen(parent)
            if shown is not None:
                await chat_tree.archive_from(tx, chat_id, shown.run_id)
            await chat_tree.select(tx, chat_id, run_id)
            tree = await chat_tree.load_tree(tx, chat_id)
            await chat_tree.restore(tx, chat_id, [n.run_id for n in tree.path(parent)])
            await tx.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (time.time(), chat_id))
            return True

        return await self._store.write(move)

    async def branch(self, owner: Owner, chat_id: str, upto_run_id: str, title: str) -> Chat | None:
        """A new chat of ``owner`` holding the shown path up to and including
        ``upto_run_id`` (fresh run ids; no other versions); None if ``chat_id`` is not
        the owner's."""
        now = time.time()
        chat = Chat(uuid.uuid4().hex, title, now, now)

        async def copy(tx: Tx) -> Chat | None:
            if not await owns(tx, owner, chat_id):
                return None
            await tx.execute(
                "INSERT INTO chats (id, title, created_at, updated_at, user_id) "
                "VALUES (?, ?, ?, ?, ?)",
                (chat.id, chat.title, chat.created_at, chat.updated_at, owner.user_id),
            )
            segments: list[StoredSegment] = []
            for segment in await stored_segments(tx, chat_id):
                segments.append(segment)
                if segment.run_id == upto_run_id:
                    break
            parent: str | None = None
            for number, segment in enumerate(segments, 1):
                run_id = uuid.uuid4().hex
                await chat_tree.add_node(tx, chat.id, run_id, parent, run_id, (number, number))
                await chat_settings.copy_run(tx, segment.run_id, run_id)
                moved = StoredSegment(
                    run_id, segment.entry_count, segment.entries_json, segment.meta_json
                )
                await append_segments(tx, chat.id, [moved])
                parent = run_id
            await chat_settings.copy_chat(tx, chat_id, chat.id)
            await attachments.copy_links(tx, chat_id, chat.id)
            return chat

        return await self._store.write(copy)

    async def end_continuation(
        self,
        chat_id: str,
        run_id: str,
        target: str,
        produced: list[Entry] | None,
        meta: dict[str, Any] | None,
    ) -> list[Entry]:
        """Fold continuation ``run_id`` into reply ``target``: one segment under the
        target's run id, the continuation's own segment and checkpoint gone, the chat
        idle -- one transaction. ``produced`` None: take the continuation's stored
        segment (it completed before a crash). Returns the folded segment's entries."""

        async def fold(tx: Tx) -> list[Entry]:
            taken = {s.run_id: s for s in await cut_segments(tx, chat_id, target)}
            entries: list[Entry] = []
            if target in taken:
                own = taken.get(run_id)
                if produced is not None:
                    added = produced
                else:
                    added = own.decode(chat_id).entries if own is not None else []
                entries = chat_tree.continued(taken[target].decode(chat_id).entries, added)
                if meta is None and produced is None and own is not None:
                    kept_meta = own.decode(chat_id).meta
                else:
                    kept_meta = meta
                await append_segments(
                    tx, chat_id, [StoredSegment.encode(target, entries, kept_meta)]
                )
            await chat_settings.record_outcome(tx, run_id, target)
            await _delete_checkpoints(tx, [run_id])
            await tx.execute(
                "UPDATE chats SET active_run_id = NULL, stop_requested_run_id = NULL, "
                "continues_run_id = NULL, updated_at = ? WHERE id = ? AND active_run_id = ?",
                (time.time(), chat_id, run_id),
            )
            return entries

        return await self._store.write(fold)

    async def backfill(self) -> int:
        """Tree nodes for chats stored before versions existed; returns how many chats."""
        return await self._store.write(chat_tree.backfill_all)

    async def request_stop(self, chat_id: str, run_id: str) -> None:
        await self._update(chat_id, "stop_requested_run_id = ?", (run_id,))

    async def run_input(self, run_id: str) -> str | None:
        """The text the run in flight ``run_id`` was started with, if it had one."""

        async def select(tx: Tx) -> str | None:
            rows = list(await tx.fetch("SELECT input FROM run_inputs WHERE run_id = ?", (run_id,)))
            return str(rows[0][0]) if rows else None

        return await self._store.read(select)

    async def end_run(self, chat_id: str, run_id: str) -> None:
        """Clear the run in flight, only if it is still this run, and drop its checkpoint
        (its entries are in the session by now): one transaction, one flush."""

        async def end(tx: Tx) -> None:
            await tx.execute(
                "UPDATE chats SET active_run_id = NULL, stop_requested_run_id = NULL, "
                "continues_run_id = NULL, updated_at = ? WHERE id = ? AND active_run_id = ?",
                (time.time(), chat_id, run_id),
            )
            await chat_settings.record_outcome(tx, run_id, run_id)
            await _delete_checkpoints(tx, [run_id])

        await self._store.write(end)

    async def release_run(
        self, chat_id: str, run_id: str, meta: dict[str, Any], entries: list[Entry]
    ) -> None:
        """The last resort when run ``run_id``'s outcome could not be recorded: the chat
        idle again, the run's stored reply marked with ``meta`` (its failure and why), or
        ``entries`` stored as that reply when it has none, its checkpoint gone. Its usage
        is not recorded (reading it may be what failed). One transaction."""

        async def release(tx: Tx) -> None:
            meta_json = StoredSegment.encode(run_id, [], meta).meta_json
            marked = await tx.execute(
                "UPDATE session_segments SET meta_json = ? WHERE session_id = ? AND run_id = ?",
                (meta_json, chat_id, run_id),
            )
            if not marked and entries:
                await append_segments(tx, chat_id, [StoredSegment.encode(run_id, entries, meta)])
            await tx.execute(
                "UPDATE chat_runs SET finished_at = ? WHERE run_id = ? AND finished_at IS NULL",
                (time.time(), run_id),
            )
            await _delete_checkpoints(tx, [run_id])
            await tx.execute(
                "UPDATE chats SET active_run_id = NULL, stop_requested_run_id = NULL, "
                "continues_run_id = NULL, updated_at = ? WHERE id = ? AND active_run_id = ?",
                (time.time(), chat_id, run_id),
            )

        await self._store.write(release)

    async def _update(self, chat_id: str, assignments: str, params: tuple[Any, ...]) -> bool:
        async def update(tx: Tx) -> bool:
            return (
                await tx.execute(f"UPDATE chats SET {assignments} WHERE id = ?", (*params, chat_id))
                > 0
            )

        return await self._store.write(update)
