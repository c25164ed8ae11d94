"""Full-text search over every chat: titles and the text of every message of every version.

An FTS5 index (``chat_search``) holds one document per chat title and one per
run, wherever the run's segment lives: the session (the shown path) or the
version archive (``chat_runs.entries_json``). Triggers on those tables keep the
index in step, so it changes in the same transaction as the append, rewind,
switch, import or delete that changed the text -- no code path can forget it,
and a crash can never leave the index behind the data. ``search_docs`` maps a
document to its FTS rowid, so a delete is an index lookup, not a scan.

User queries never reach FTS syntax: each word becomes a quoted string (the
last one a prefix, for search as you type), so quotes, operators, brackets
and markup are just text.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from markupsafe import Markup, escape

from webapp.chats.db import Tx
from webapp.chats.users import Owner

# Snippet markers, turned into <mark> after escaping. Private-use characters, which
# a message may hold too: the index takes them out of every text it holds (`_plain`).
_OPEN, _CLOSE = "\ue000", "\ue001"

# Which text of an entry is searchable: messages, replies, reasoning, tool results.
# json_extract ends a text at its first NUL (C strings), so an escaped NUL in the
# JSON becomes a space first -- after every escaped backslash became its \u005c
# spelling, so that the "\u0000" of a literal backslash and "u0000" is not one.
_BODY = (
    "(SELECT {plain} FROM json_each("
    r"replace(replace({json}, '\\', '\u005c'), '\u0000', ' ')) AS e)"
)
_TEXTS = (
    "group_concat(COALESCE(json_extract(e.value, '$.text'), "
    "json_extract(e.value, '$.output'), ''), ' ')"
)


def _plain(text: str) -> str:
    """``text`` without the excerpt markers: text that holds them cannot fake a match."""
    return f"replace(replace({text}, char({ord(_OPEN)}), ' '), char({ord(_CLOSE)}), ' ')"


def _body(json: str) -> str:
    return _BODY.format(plain=_plain(_TEXTS), json=json)


def _add(chat: str, source: str, json: str) -> str:
    """Trigger statements that index one row's text as a document."""
    return f"""
    INSERT INTO search_docs (chat_id, run_id, source) VALUES ({chat}, new.run_id, '{source}');
    INSERT INTO chat_search (rowid, body) VALUES (last_insert_rowid(), {_body(json)});"""


def _drop(chat: str, source: str) -> str:
    """Trigger statements that take one row's document out of the index."""
    return f"""
    DELETE FROM chat_search WHERE rowid IN (SELECT id FROM search_docs
        WHERE chat_id = {chat} AND run_id = old.run_id AND source = '{source}');
    DELETE FROM search_docs WHERE chat_id = {chat} AND run_id = old.run_id AND source = '{source}';"""


def _trigger(name: str, event: str, table: str, when: str, body: str) -> str:
    condition = f" WHEN {when}" if when else ""
    return f"CREATE TRIGGER IF NOT EXISTS {name} AFTER {event} ON {table}{condition} BEGIN{body}\nEND;\n"


_SESSION_ADD = _add("new.session_id", "session", "new.entries_json")
_SESSION_DROP = _drop("old.session_id", "session")
_ARCHIVE_ADD = _add("new.chat_id", "archive", "new.entries_json")
_ARCHIVE_DROP = _drop("old.chat_id", "archive")

SCHEMA = (
    """
CREATE VIRTUAL TABLE IF NOT EXISTS chat_search USING fts5(
    body, tokenize = 'unicode61 remove_diacritics 2'
);
CREATE TABLE IF NOT EXISTS search_docs (
    id      INTEGER PRIMARY KEY,
    chat_id TEXT NOT NULL,
    run_id  TEXT NOT NULL,
    source  TEXT NOT NULL,
    UNIQUE (chat_id, run_id, source)
);
CREATE INDEX IF NOT EXISTS search_docs_by_chat ON search_docs (chat_id);
"""
    # The shown path: every segment the session gains, loses or rewrites.
    + _trigger("search_session_ai", "INSERT", "session_segments", "", _SESSION_ADD)
    + _trigger("search_session_ad", "DELETE", "session_segments", "", _SESSION_DROP)
    + _trigger(
        "search_session_au", "UPDATE OF entries_json", "session_segments", "",
        _SESSION_DROP + _SESSION_ADD,
    )
    # The other versions: a run's archived segment comes and goes with its moves.
    + _trigger(
        "search_archive_ai", "INSERT", "chat_runs", "new.entries_json IS NOT NULL", _ARCHIVE_ADD
    )
    + _trigger(
        "search_archive_ad", "DELETE", "chat_runs", "old.entries_json IS NOT NULL", _ARCHIVE_DROP
    )
    + _trigger(
        "search_archive_out", "UPDATE OF entries_json", "chat_runs",
        "old.entries_json IS NOT NULL", _ARCHIVE_DROP,
    )
    + _trigger(
        "search_archive_in", "UPDATE OF entries_json", "chat_runs",
        "new.entries_json IS NOT NULL", _ARCHIVE_ADD,
    )
    + f"""
CREATE TRIGGER IF NOT EXISTS search_title_ai AFTER INSERT ON chats BEGIN
    INSERT INTO search_docs (chat_id, run_id, source) VALUES (new.id, '', 'title');
    INSERT INTO chat_search (rowid, body) VALUES (last_insert_rowid(), {_plain("new.title")});
END;
CREATE TRIGGER IF NOT EXISTS search_title_au AFTER UPDATE OF title ON chats BEGIN
    UPDATE chat_search SET body = {_plain("new.title")} WHERE rowid IN
        (SELECT id FROM search_docs WHERE chat_id = new.id AND source = 'title');
END;
CREATE TRIGGER IF NOT EXISTS search_title_ad AFTER DELETE ON chats BEGIN
    DELETE FROM chat_search WHERE rowid IN
        (SELECT id FROM search_docs WHERE chat_id = old.id AND source = 'title');
    DELETE FROM search_docs WHERE chat_id = old.id AND source = 'title';
END;
"""
)  # fmt: skip

# Fills the index from what is stored (a database made before search existed).
REBUILD = f"""
DELETE FROM chat_search;
DELETE FROM search_docs;
INSERT INTO search_docs (chat_id, run_id, source) SELECT id, '', 'title' FROM chats;
INSERT INTO search_docs (chat_id, run_id, source)
    SELECT session_id, run_id, 'session' FROM session_segments;
INSERT INTO search_docs (chat_id, run_id, source)
    SELECT chat_id, run_id, 'archive' FROM chat_runs WHERE entries_json IS NOT NULL;
INSERT INTO chat_search (rowid, body)
    SELECT d.id, {_plain("c.title")} FROM search_docs d JOIN chats c ON c.id = d.chat_id
    WHERE d.source = 'title';
INSERT INTO chat_search (rowid, body)
    SELECT d.id, {_body("s.entries_json")} FROM search_docs d
    JOIN session_segments s ON s.session_id = d.chat_id AND s.run_id = d.run_id
    WHERE d.source = 'session';
INSERT INTO chat_search (rowid, body)
    SELECT d.id, {_body("r.entries_json")} FROM search_docs d
    JOIN chat_runs r ON r.chat_id = d.chat_id AND r.run_id = d.run_id
    WHERE d.source = 'archive';
"""

_TRIGGERS = (
    "search_session_ai", "search_session_ad", "search_session_au", "search_archive_ai",
    "search_archive_ad", "search_archive_out", "search_archive_in", "search_title_ai",
    "search_title_au", "search_title_ad",
)  # fmt: skip

# A database indexed before NULs and the markers were taken care of: the triggers
# as they are now, and the index filled again.
REINDEX = "".join(f"DROP TRIGGER IF EXISTS {name};\n" for name in _TRIGGERS) + SCHEMA + REBUILD

MAX_WORDS = 12
MIN_PREFIX = 3  # shorter prefixes ("p*") match nearly every document: too costly to help
MAX_RESULTS = 50
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class SearchHit:
    chat_id: str
    title: str
    updated_at: float
    excerpt: Markup  # escaped text with the matching words in <mark>


def query_words(text: str) -> list[str]:
    """The first `MAX_WORDS` words of a query, composed (NFC) as typed text is: an
    "e" followed by a combining acute accent is the "é" the index holds, one word."""
    return _WORD.findall(unicodedata.normalize("NFC", text))[:MAX_WORDS]


def fts_query(text: str) -> str | None:
    """An FTS5 query matching every word of ``text`` (the last, if long enough, as a
    prefix), or None when it has no words."""
    words = query_words(text)
    if not words:
        return None
    quoted = ['"' + w.replace('"', '""') + '"' for w in words]
    if len(words[-1]) >= MIN_PREFIX:
        quoted[-1] += "*"  # still typing: "pyth" finds "python"
    return " ".join(quoted)


async def search(tx: Tx, text: str, owner: Owner) -> list[SearchHit]:
    """``owner``'s chats whose title or any message (any version) matches, most recently
    active first."""
    query = fts_query(text)
    if query is None:
        return []
    mine = "" if owner.user_id is None else "WHERE c.user_id = ?3"
    # One pass over the matches finds the chats, newest first, each with its latest
    # matching document; only those few documents pay for an excerpt.
    chats = list(
        await tx.fetch(
            f"""
            SELECT c.id, c.title, c.updated_at, found.doc FROM chats c JOIN (
                SELECT d.chat_id, MAX(d.id) AS doc FROM search_docs d
                JOIN (SELECT rowid FROM chat_search WHERE chat_search MATCH ?1) m
                    ON m.rowid = d.id
                GROUP BY d.chat_id
            ) found ON found.chat_id = c.id {mine}
            ORDER BY c.updated_at DESC, c.id LIMIT ?2
            """,
            (query, MAX_RESULTS, *([owner.user_id] if owner.user_id is not None else [])),
        )
    )
    if not chats:
        return []
    marks = ",".join("?" * len(chats))
    rows = await tx.fetch(
        f"SELECT rowid, snippet(chat_search, 0, '{_OPEN}', '{_CLOSE}', '…', 16) "
        f"FROM chat_search WHERE chat_search MATCH ? AND rowid IN ({marks})",
        (query, *(c[3] for c in chats)),
    )
    excerpts: dict[int, str] = {int(r[0]): str(r[1]) for r in rows}
    return [
        SearchHit(str(c), str(title), float(at), _excerpt(excerpts.get(doc)))
        for c, title, at, doc in chats
    ]


def _excerpt(snippet: str | None) -> Markup:
    text = str(escape(" ".join((snippet or "").split())))
    return Markup(text.replace(_OPEN, "<mark>").replace(_CLOSE, "</mark>"))
