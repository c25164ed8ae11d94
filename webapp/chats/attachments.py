"""Attached files in the chat database: stored once per content hash, freed with the last chat.

Tables (the same in both dialects but for the column types and the index):
- ``attachment_files``: one row per distinct content (``id`` = its sha256),
  the bytes (SQLite BLOB, PostgreSQL bytea) and a document's whole text;
- ``attachment_chunks``: a document's text in pieces of about 1,500
  characters, never across two pages, under the full-text index (FTS5,
  ``attachment_search``, on SQLite; a tsvector under GIN on PostgreSQL) that
  excerpts are picked with;
- ``message_files``: which chat holds which file under which name -- what a
  download checks, what search names, and what a delete frees;
- ``run_files``: the attachments of a run in flight, written with its input,
  so a run restarted from its input sends what it would have sent.

Invariant: a file row exists only while some chat's ``message_files`` row
(or a project's ``project_files`` row, SPEC §15) names it. They are written in the transaction that records the message
(`store_files`, called by `ChatStore.begin_run`) and taken out in the one that
deletes the chat (`forget_chat`), so no crash leaves a file without a chat or
a message without its file.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from markupsafe import Markup

from webapp.chats.db import ChatDatabase, Tx
from webapp.chats.file_reading import Chunk
from webapp.chats.search import _WORD, MAX_RESULTS, SearchHit, _excerpt, fts_query, query_words
from webapp.chats.search_pg import ts_query
from webapp.chats.users import Owner
from webapp.transcript import Attachment

_COMMON = """
CREATE TABLE IF NOT EXISTS message_files (
    chat_id TEXT NOT NULL,
    file_id TEXT NOT NULL,
    name    TEXT NOT NULL,
    PRIMARY KEY (chat_id, file_id, name)
);
CREATE INDEX IF NOT EXISTS message_files_by_file ON message_files (file_id);
CREATE TABLE IF NOT EXISTS run_files (
    run_id      TEXT PRIMARY KEY,
    attachments TEXT NOT NULL
);
"""

SQLITE_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS attachment_files (
    id         TEXT PRIMARY KEY,
    media_type TEXT NOT NULL,
    size       INTEGER NOT NULL,
    data       BLOB NOT NULL,
    text       TEXT
);
CREATE TABLE IF NOT EXISTS attachment_chunks (
    id      INTEGER PRIMARY KEY,
    file_id TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    page    INTEGER,
    text    TEXT NOT NULL,
    UNIQUE (file_id, seq)
);
-- The index holds only the words: a ranked match reads no chunk's text but the few
-- that are picked (external content, filled and emptied with the chunks below).
CREATE VIRTUAL TABLE IF NOT EXISTS attachment_search USING fts5(
    text, content = 'attachment_chunks', content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);
"""
    + _COMMON
)

POSTGRES_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS attachment_files (
    id         TEXT PRIMARY KEY,
    media_type TEXT NOT NULL,
    size       BIGINT NOT NULL,
    data       BYTEA NOT NULL,
    text       TEXT
);
CREATE TABLE IF NOT EXISTS attachment_chunks (
    file_id TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    page    INTEGER,
    text    TEXT NOT NULL,
    words   tsvector GENERATED ALWAYS AS (to_tsvector('simple', left(text, 100000))) STORED,
    PRIMARY KEY (file_id, seq)
);
CREATE INDEX IF NOT EXISTS attachment_chunks_words ON attachment_chunks USING GIN (words);
"""
    + _COMMON
)

MAX_EXCERPT_WORDS = 64  # of a message, looked for in its documents


@dataclass(frozen=True)
class NewFile:
    """A file read from an upload, to be stored with its message."""

    attachment: Attachment
    data: bytes
    text: str | None  # a document's whole text; None for an image
    chunks: tuple[Chunk, ...] = ()


@dataclass(frozen=True)
class StoredFile:
    name: str
    media_type: str
    data: bytes
    id: str = ""


@dataclass(frozen=True)
class Excerpt:
    file_id: str
    seq: int
    page: int | None
    text: str


def encode_attachments(attachments: Iterable[Attachment]) -> str:
    return json.dumps([asdict(a) for a in attachments], ensure_ascii=False)


def decode_attachments(text: str) -> tuple[Attachment, ...]:
    return tuple(Attachment.from_dict(item) for item in json.loads(text))


async def store_files(
    tx: Tx,
    chat_id: str,
    run_id: str,
    attachments: Sequence[Attachment],
    files: Sequence[NewFile],
) -> None:
    """The message's files (new ones stored, known ones only linked) and the run's list."""
    await store_new(tx, files)
    await link(tx, chat_id, attachments)
    if attachments:
        await tx.execute(
            "INSERT INTO run_files (run_id, attachments) VALUES (?, ?)",
            (run_id, encode_attachments(attachments)),
        )


async def store_new(tx: Tx, files: Sequence[NewFile]) -> None:
    """Each file's row and chunks, unless its content is stored already."""
    for new in files:
        file = new.attachment
        added = await tx.execute(
            "INSERT INTO attachment_files (id, media_type, size, data, text) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            (file.id, file.media_type, file.size, new.data, new.text),
        )
        if added:
            await tx.executemany(
                "INSERT INTO attachment_chunks (file_id, seq, page, text) VALUES (?, ?, ?, ?)",
                [(file.id, c.seq, c.page, c.text) for c in new.chunks],
            )
            if tx.dialect == "sqlite":
                await tx.execute(
                    "INSERT INTO attachment_search (rowid, text) "
                    "SELECT id, text FROM attachment_chunks WHERE file_id = ?",
                    (file.id,),
                )


async def link(tx: Tx, chat_id: str, attachments: Iterable[Attachment]) -> None:
    await tx.executemany(
        "INSERT INTO message_files (chat_id, file_id, name) VALUES (?, ?, ?) "
        "ON CONFLICT (chat_id, file_id, name) DO NOTHING",
        [(chat_id, a.id, a.name) for a in attachments],
    )


async def copy_links(tx: Tx, from_chat: str, to_chat: str) -> None:
    """``to_chat`` holds every file ``from_chat`` holds (a branch of it)."""
    await tx.execute(
        "INSERT INTO message_files (chat_id, file_id, name) "
        "SELECT ?, file_id, name FROM message_files WHERE chat_id = ? "
        "ON CONFLICT (chat_id, file_id, name) DO NOTHING",
        (to_chat, from_chat),
    )


async def forget_chat(tx: Tx, chat_id: str) -> None:
    """Take the chat's links out, and the files no other chat still holds."""
    rows = await tx.fetch(
        "SELECT DISTINCT file_id FROM message_files WHERE chat_id = ?", (chat_id,)
    )
    await tx.execute("DELETE FROM message_files WHERE chat_id = ?", (chat_id,))
    for (file_id,) in rows:
        await free_unused(tx, str(file_id))


async def free_unused(tx: Tx, file_id: str) -> None:
    """Delete the file (its row, chunks and index entries) unless a chat's message or a
    project (SPEC §15, ``project_files``) still names it."""
    for table in ("message_files", "project_files"):
        if await tx.fetch(f"SELECT 1 FROM {table} WHERE file_id = ? LIMIT 1", (file_id,)):
            return
    if tx.dialect == "sqlite":  # out of the index first, while its text is there
        await tx.execute(
            "INSERT INTO attachment_search (attachment_search, rowid, text) "
            "SELECT 'delete', id, text FROM attachment_chunks WHERE file_id = ?",
            (file_id,),
        )
    await tx.execute("DELETE FROM attachment_chunks WHERE file_id = ?", (file_id,))
    await tx.execute("DELETE FROM attachment_files WHERE id = ?", (file_id,))


async def run_attachments(tx: Tx, run_id: str) -> tuple[Attachment, ...]:
    rows = await tx.fetch("SELECT attachments FROM run_files WHERE run_id = ?", (run_id,))
    return decode_attachments(str(rows[0][0])) if rows else ()


async def text_sizes(tx: Tx, file_ids: Sequence[str]) -> dict[str, int]:
    """How many characters of text each document holds (images are left out)."""
    found: dict[str, int] = {}
    for file_id in dict.fromkeys(file_ids):
        rows = await tx.fetch(
            "SELECT length(text) FROM attachment_files WHERE id = ? AND text IS NOT NULL",
            (file_id,),
        )
        if rows:
            found[file_id] = int(rows[0][0])
    return found


async def texts(tx: Tx, file_ids: Sequence[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for file_id in dict.fromkeys(file_ids):
        rows = await tx.fetch("SELECT text FROM attachment_files WHERE id = ?", (file_id,))
        if rows and rows[0][0] is not None:
            found[file_id] = str(rows[0][0])
    return found


async def data_of(tx: Tx, file_id: str) -> bytes | None:
    rows = await tx.fetch("SELECT data FROM attachment_files WHERE id = ?", (file_id,))
    return bytes(rows[0][0]) if rows else None


async def owned_file(tx: Tx, owner: Owner, chat_id: str, file_id: str) -> StoredFile | None:
    """The file, if ``chat_id`` is ``owner``'s and holds it; None otherwise."""
    mine = "" if owner.user_id is None else " AND c.user_id = ?"
    rows = await tx.fetch(
        "SELECT m.name, f.media_type, f.data FROM message_files m "
        "JOIN attachment_files f ON f.id = m.file_id JOIN chats c ON c.id = m.chat_id "
        f"WHERE m.chat_id = ? AND m.file_id = ?{mine} ORDER BY m.name LIMIT 1",
        (chat_id, file_id, *([] if owner.user_id is None else [owner.user_id])),
    )
    if not rows:
        return None
    name, media_type, data = rows[0]
    return StoredFile(str(name), str(media_type), bytes(data))


async def chat_files(tx: Tx, chat_id: str) -> list[StoredFile]:
    """Every file the chat holds (one name of each), for its export."""
    rows = await tx.fetch(
        "SELECT f.id, (SELECT MIN(m.name) FROM message_files m WHERE m.chat_id = ? "
        "AND m.file_id = f.id), f.media_type, f.data FROM attachment_files f WHERE f.id IN "
        "(SELECT file_id FROM message_files WHERE chat_id = ?) ORDER BY f.id",
        (chat_id, chat_id),
    )
    return [StoredFile(str(n), str(t), bytes(d), str(i)) for i, n, t, d in rows]


def excerpt_query(text: str, dialect: str) -> str | None:
    """Any of the message's words (up to `MAX_EXCERPT_WORDS`), in the index's syntax, each
    quoted: a message's words never reach the query language."""
    found = _WORD.findall(unicodedata.normalize("NFC", text))
    words = list(dict.fromkeys(w.lower() for w in found if len(w) > 1))[:MAX_EXCERPT_WORDS]
    if dialect == "postgresql":
        quoted = ["'" + w.replace("'", "''") + "'" for w in words if len(w.encode()) < 2048]
        return " | ".join(quoted) or None
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in words) or None


async def excerpts(tx: Tx, file_ids: Sequence[str], message: str, budget: int) -> list[Excerpt]:
    """The chunks of ``file_ids`` most relevant to ``message`` that fit ``budget``
    characters, in document order; a chunk matching none of its words is left out."""
    query = excerpt_query(message, tx.dialect)
    if query is None or not file_ids or budget <= 0:
        return []
    marks = ",".join("?" * len(file_ids))
    limit = budget // 400 + 20  # chunks are about 1,500 characters: more than can fit
    if tx.dialect == "postgresql":
        rows = await tx.fetch(
            f"SELECT file_id, seq, page, text FROM attachment_chunks, "
            f"to_tsquery('simple', CAST(? AS TEXT)) q WHERE file_id IN ({marks}) AND words @@ q "
            "ORDER BY ts_rank(words, q) DESC, file_id, seq LIMIT ?",
            (query, *file_ids, limit),
        )
    else:
        ranked = await tx.fetch(
            f"SELECT c.id FROM attachment_search s JOIN attachment_chunks c ON c.id = s.rowid "
            f"WHERE attachment_search MATCH ? AND c.file_id IN ({marks}) "
            "ORDER BY s.rank, c.file_id, c.seq LIMIT ?",
            (query, *file_ids, limit),
        )
        rank_of = {int(r[0]): i for i, r in enumerate(ranked)}
        found = (
            await tx.fetch(
                "SELECT id, file_id, seq, page, text FROM attachment_chunks WHERE id IN "
                f"({','.join('?' * len(rank_of))})",
                tuple(rank_of),
            )
            if rank_of
            else []
        )
        rows = [r[1:] for r in sorted(found, key=lambda r: rank_of[int(r[0])])]
    chosen: list[Excerpt] = []
    left = budget
    for file_id, seq, page, text in rows:
        if len(text) > left:
            continue
        chosen.append(Excerpt(str(file_id), int(seq), None if page is None else int(page), text))
        left -= len(text)
    order = {file_id: i for i, file_id in enumerate(file_ids)}
    chosen.sort(key=lambda e: (order[e.file_id], e.seq))
    return chosen


async def search_files(tx: Tx, text: str, owner: Owner) -> list[SearchHit]:
    """``owner``'s chats holding a document whose text matches, naming the file."""
    snippets: dict[str, str] = {}
    if tx.dialect == "postgresql":
        query = ts_query(text)
        if query is None:
            return []
        rows = await tx.fetch(
            "SELECT file_id, text FROM attachment_chunks "
            "WHERE words @@ to_tsquery('simple', CAST(? AS TEXT)) ORDER BY file_id, seq LIMIT 500",
            (query,),
        )
        for file_id, chunk in rows:
            snippets.setdefault(str(file_id), _around(str(chunk), query_words(text)))
    else:
        query = fts_query(text)
        if query is None:
            return []
        rows = await tx.fetch(
            "SELECT c.file_id, snippet(attachment_search, 0, char(57344), char(57345), '…', 16) "
            "FROM attachment_search s JOIN attachment_chunks c ON c.id = s.rowid "
            "WHERE attachment_search MATCH ? LIMIT 500",
            (query,),
        )
        for file_id, snippet in rows:
            snippets.setdefault(str(file_id), str(snippet))
    if not snippets:
        return []
    mine = "" if owner.user_id is None else " AND c.user_id = ?"
    marks = ",".join("?" * len(snippets))
    rows = await tx.fetch(
        "SELECT c.id, c.title, c.updated_at, m.name, m.file_id FROM message_files m "
        f"JOIN chats c ON c.id = m.chat_id WHERE m.file_id IN ({marks}){mine} "
        "ORDER BY c.updated_at DESC, c.id, m.name LIMIT ?",
        (*snippets, *([] if owner.user_id is None else [owner.user_id]), MAX_RESULTS),
    )
    hits: dict[str, SearchHit] = {}
    for chat_id, title, updated_at, name, file_id in rows:
        if str(chat_id) not in hits:
            excerpt = Markup("<cite>%s</cite>: ") % name + _excerpt(snippets[str(file_id)])
            hits[str(chat_id)] = SearchHit(str(chat_id), str(title), float(updated_at), excerpt)
    return list(hits.values())


def _around(text: str, words: list[str]) -> str:
    """A short piece of ``text`` around the first of ``words`` it holds, words marked."""
    lower = text.lower()
    at = min((i for i in (lower.find(w.lower()) for w in words) if i >= 0), default=0)
    piece = text[max(at - 80, 0) : at + 120]
    for word in words:
        piece = _mark(piece, word)
    return ("…" if at > 80 else "") + piece + "…"


def _mark(text: str, word: str) -> str:
    return re.sub(
        re.escape(word), lambda m: "\ue000" + m.group(0) + "\ue001", text, flags=re.IGNORECASE
    )


class FileStore:
    """The attachment tables of one chat database (`ChatStore.files`)."""

    def __init__(self, store: ChatDatabase) -> None:
        self._store = store

    async def owned(self, owner: Owner, chat_id: str, file_id: str) -> StoredFile | None:
        return await self._store.read(lambda tx: owned_file(tx, owner, chat_id, file_id))

    async def run_attachments(self, run_id: str) -> tuple[Attachment, ...]:
        return await self._store.read(lambda tx: run_attachments(tx, run_id))

    async def text_sizes(self, file_ids: Sequence[str]) -> dict[str, int]:
        return await self._store.read(lambda tx: text_sizes(tx, file_ids))

    async def texts(self, file_ids: Sequence[str]) -> dict[str, str]:
        return await self._store.read(lambda tx: texts(tx, file_ids))

    async def data(self, file_id: str) -> bytes | None:
        return await self._store.read(lambda tx: data_of(tx, file_id))

    async def excerpts(self, file_ids: Sequence[str], message: str, budget: int) -> list[Excerpt]:
        return await self._store.read(lambda tx: excerpts(tx, file_ids, message, budget))

    async def search(self, owner: Owner, text: str) -> list[SearchHit]:
        return await self._store.read(lambda tx: search_files(tx, text, owner))
