"""chat_search_pg: the PostgreSQL search index, in step with every change, safe for any query.

The tables are the app's own (session, tree, chats) in a schema of the test's
own; rows are written with plain SQL, as the chat layer's transactions would.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import asyncpg
import pytest

from webapp.chats import search_pg as chat_search_pg
from webapp.chats import tree as chat_tree
from webapp.chats.db import PostgresTx
from webapp.chats.search import MAX_RESULTS, SearchHit
from webapp.chats.users import EVERY_CHAT
from webapp.stores.codec import StoredSegment
from webapp.stores.postgres_session import SCHEMA_SQL as SESSION_SCHEMA
from webapp.transcript import (
    AssistantEntry,
    Entry,
    ReasoningEntry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
)

# chat_store's chats table, as it is on PostgreSQL.
CHATS = """
CREATE TABLE IF NOT EXISTS chats (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL DEFAULT '',
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    active_run_id TEXT,
    stop_requested_run_id TEXT,
    continues_run_id TEXT
);
"""

HOSTILE = [
    "a & b | !c :* ' \" \\ ( )",
    "'",
    "''quoted''",
    "\\",
    "!",
    "a:*",
    "a:* & !b",
    "zebras:A",
    "<-> <2>",
    "(zebras",
    "*",
    "AND OR NOT",
    "<script>alert(1)</script>",
    "x" * 5000,
    "zebras " * 1000,
    "a & b | !c :* ' \" \\ ( ) " * 200,
    "\u0000\u202e",
    "$1 $2 ? ?",
]


class Chats:
    """Writes the rows the chat layer writes, one statement at a time (autocommit)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.clock = itertools.count(1)

    async def new(self, chat_id: str, title: str = "") -> str:
        at = float(next(self.clock))
        await self.conn.execute(
            "INSERT INTO chats (id, title, created_at, updated_at) VALUES ($1, $2, $3, $3)",
            chat_id,
            title,
            at,
        )
        return chat_id

    async def touch(self, chat_id: str) -> None:
        await self.conn.execute(
            "UPDATE chats SET updated_at = $2 WHERE id = $1", chat_id, float(next(self.clock))
        )

    async def append(self, chat_id: str, run_id: str, *entries: Entry) -> None:
        """A finished run: its segment on the shown path, its node in the tree."""
        s = StoredSegment.encode(run_id, list(entries), {"model": "scripted"})
        await self.conn.execute(
            """
            INSERT INTO session_segments
                (session_id, seq, run_id, first_entry, entry_count, entries_json, meta_json)
            SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, COALESCE(SUM(entry_count), 0), $3, $4, $5
            FROM session_segments WHERE session_id = $1
            """,
            chat_id,
            run_id,
            s.entry_count,
            s.entries_json,
            s.meta_json,
        )
        await self.conn.execute(
            "INSERT INTO chat_runs (run_id, chat_id, message_id, seq, selected) "
            "VALUES ($1, $2, $1, (SELECT COUNT(*) FROM chat_runs WHERE chat_id = $2), 1)",
            run_id,
            chat_id,
        )
        await self.touch(chat_id)

    async def archive(self, chat_id: str, run_id: str) -> None:
        """Move a run's segment off the shown path into the archive (an edit's rewind)."""
        async with self.conn.transaction():
            await self.conn.execute(
                "UPDATE chat_runs r SET entry_count = s.entry_count, "
                "entries_json = s.entries_json, meta_json = s.meta_json "
                "FROM session_segments s WHERE s.session_id = $1 AND s.run_id = $2 "
                "AND r.run_id = s.run_id",
                chat_id,
                run_id,
            )
            await self.conn.execute(
                "DELETE FROM session_segments WHERE session_id = $1 AND run_id = $2",
                chat_id,
                run_id,
            )

    async def restore(self, chat_id: str, run_id: str) -> None:
        """Move an archived run back onto the shown path (a switch)."""
        async with self.conn.transaction():
            await self.conn.execute(
                "INSERT INTO session_segments "
                "(session_id, seq, run_id, first_entry, entry_count, entries_json, meta_json) "
                "SELECT $1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM session_segments "
                "WHERE session_id = $1), run_id, 0, entry_count, entries_json, meta_json "
                "FROM chat_runs WHERE chat_id = $1 AND run_id = $2",
                chat_id,
                run_id,
            )
            await self.conn.execute(
                "UPDATE chat_runs SET entry_count = NULL, entries_json = NULL, meta_json = NULL "
                "WHERE chat_id = $1 AND run_id = $2",
                chat_id,
                run_id,
            )

    async def delete(self, chat_id: str) -> None:
        async with self.conn.transaction():
            await self.conn.execute("DELETE FROM session_segments WHERE session_id = $1", chat_id)
            await self.conn.execute("DELETE FROM chat_runs WHERE chat_id = $1", chat_id)
            await self.conn.execute("DELETE FROM chats WHERE id = $1", chat_id)


@pytest.fixture
async def conn(postgres_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(postgres_dsn)
    await conn.execute(SESSION_SCHEMA + chat_tree.SCHEMA + CHATS + chat_search_pg.SCHEMA)
    yield conn
    await conn.close()


@pytest.fixture
def chats(conn: asyncpg.Connection) -> Chats:
    return Chats(conn)


async def hits(conn: asyncpg.Connection, text: str) -> list[SearchHit]:
    async with conn.transaction():
        return await chat_search_pg.search(PostgresTx(conn), text, EVERY_CHAT)


async def found(conn: asyncpg.Connection, text: str) -> list[str]:
    return [hit.chat_id for hit in await hits(conn, text)]


async def index_rows(conn: asyncpg.Connection) -> list[tuple[str, str, str, str, str]]:
    rows = await conn.fetch(
        "SELECT chat_id, run_id, source, body, words::text FROM search_docs "
        "ORDER BY chat_id, run_id, source"
    )
    return [tuple(r) for r in rows]


async def rebuilt_rows(conn: asyncpg.Connection) -> list[tuple[str, str, str, str, str]]:
    """The index as a rebuild from the stored data makes it (rolled back afterwards)."""
    tr = conn.transaction()
    await tr.start()
    try:
        await conn.execute(chat_search_pg.REBUILD)
        return await index_rows(conn)
    finally:
        await tr.rollback()


async def test_words_of_every_version_are_found_most_recently_active_first(chats: Chats):
    conn = chats.conn
    older = await chats.new("older")
    await chats.append(
        older,
        "r1",
        UserEntry("tell me about zebras"),
        ReasoningEntry("thinking of savannas"),
        AssistantEntry("Zebras have stripes."),
    )
    newer = await chats.new("newer")
    await chats.append(newer, "r2", UserEntry("and horses?"), AssistantEntry("Horses do not."))
    assert await found(conn, "stripes") == [older]  # only in a reply
    assert await found(conn, "savannas") == [older]  # reasoning
    assert await found(conn, "ZEBRAS") == [older]
    assert await found(conn, "do") == [newer]
    await chats.append(newer, "r3", UserEntry("and zebras?"), AssistantEntry("Zebras too."))
    assert await found(conn, "zebras") == [newer, older]
    await chats.touch(older)
    assert await found(conn, "zebras") == [older, newer]
    # Words only in an old version: the run edited away and archived.
    await chats.archive(newer, "r2")
    await chats.append(newer, "r4", UserEntry("and okapis?"), AssistantEntry("Okapis hide."))
    assert await found(conn, "horses") == [newer]
    assert await found(conn, "okapis") == [newer]
    await chats.restore(newer, "r2")
    assert await found(conn, "horses") == [newer]
    assert await found(conn, "") == []
    assert await found(conn, "giraffes") == []


async def test_tool_calls_are_not_text_but_their_results_are(chats: Chats):
    chat_id = await chats.new("c")
    await chats.append(
        chat_id,
        "r1",
        UserEntry("weather?"),
        ToolCallEntry("call1", "get_weather", '{"city": "Reykjavik"}'),
        ToolResultEntry("call1", "Drizzle over Reykjavik"),
    )
    assert await found(chats.conn, "drizzle") == [chat_id]
    assert await found(chats.conn, "get_weather") == []


async def test_the_last_word_is_a_prefix_and_every_word_must_match(chats: Chats):
    conn = chats.conn
    both = await chats.new("both")
    await chats.append(both, "r1", UserEntry("python and zebras"))
    one = await chats.new("one")
    await chats.append(one, "r2", UserEntry("python only"))
    assert await found(conn, "pyth") == [one, both]
    assert await found(conn, "py") == []  # under MIN_PREFIX: a whole word only
    assert await found(conn, "python zeb") == [both]
    assert await found(conn, "zebras PYTHON") == [both]
    assert await found(conn, "zeb python") == []  # only the last word is a prefix
    assert await found(conn, "python giraffes") == []


async def test_words_split_at_punctuation_as_in_fts5(chats: Chats):
    chat_id = await chats.new("c")
    await chats.append(
        chat_id, "r1", AssistantEntry("See webapp/web/chat_search.py or https://example.org/docs.")
    )
    for query in ["chat_search", "search", "py", "example", "org", "docs", "webapp web"]:
        assert await found(chats.conn, query) == [chat_id], query
    assert await found(chats.conn, "search_chat") == []  # a phrase: in order


async def test_at_most_max_results_most_recently_updated_first(chats: Chats):
    ids = [await chats.new(f"chat{i:03}", title=f"Common title {i}") for i in range(60)]
    assert await found(chats.conn, "common") == ids[::-1][:MAX_RESULTS]


async def test_titles_are_searchable_renames_follow_and_deleted_chats_vanish(chats: Chats):
    conn = chats.conn
    chat_id = await chats.new("c1", title="Savanna notes")
    await chats.append(chat_id, "r1", UserEntry("stripes"))
    other = await chats.new("c2", title="Other")
    assert await found(conn, "savan") == [chat_id]
    await conn.execute("UPDATE chats SET title = 'Ocean notes' WHERE id = 'c1'")
    assert await found(conn, "savanna") == []
    assert await found(conn, "ocean") == [chat_id]
    assert await found(conn, "notes") == [chat_id]
    await chats.delete(chat_id)
    assert await found(conn, "ocean") == []
    assert await found(conn, "stripes") == []
    assert {row[0] for row in await index_rows(conn)} == {other}


async def test_any_query_text_is_safe(chats: Chats):
    conn = chats.conn
    chat_id = await chats.new("c", title="a b c")
    await chats.append(chat_id, "r1", AssistantEntry('He said "hi" (AND left) * zebras'))
    for query in HOSTILE:
        assert set(await found(conn, query)) <= {chat_id}, query[:40]
    assert await found(conn, '"hi" (AND') == [chat_id]  # operators are words here
    assert await found(conn, "a & b | !c :* ' \" \\ ( )") == [chat_id]  # a, b, c: the title
    assert await found(conn, "said:zebras") == [chat_id]  # words, not a weight
    assert await found(conn, "zebras:A") == []  # "a" is only in the title: another document
    assert await found(conn, "x" * 5000) == []
    assert chat_search_pg.ts_query("a & b | !c :* ' \" \\ ( )") == "'a' & 'b' & 'c'"
    assert chat_search_pg.ts_query("left righ") == "'left' & 'righ':*"
    assert chat_search_pg.ts_query("!?") is None


async def test_excerpts_are_escaped_with_the_matches_marked(chats: Chats):
    chat_id = await chats.new("c", title="t")
    await chats.append(
        chat_id,
        "r1",
        UserEntry("Look: <script>alert(1)</script> are zebras & <b>horses</b> a < b, a.b?"),
    )
    [hit] = await hits(chats.conn, "zeb")
    assert hit.chat_id == chat_id and hit.title == "t" and hit.updated_at == 2.0
    # The text as written (ts_headline alone would drop what it takes for tags), escaped.
    assert str(hit.excerpt) == (
        "Look: &lt;script&gt;alert(1)&lt;/script&gt; are <mark>zebras</mark> &amp; "
        "&lt;b&gt;horses&lt;/b&gt; a &lt; b, a.b"
    )
    [hit] = await hits(chats.conn, "script alert")
    assert str(hit.excerpt).count("<mark>script</mark>") == 2
    assert str(hit.excerpt).count("<mark>alert</mark>") == 1


async def test_the_excerpt_comes_from_the_latest_matching_run(chats: Chats):
    chat_id = await chats.new("c")
    await chats.append(chat_id, "r1", UserEntry("first zebras"))
    await chats.append(chat_id, "r2", UserEntry("no match"), AssistantEntry("later zebras"))
    [hit] = await hits(chats.conn, "zebras")
    assert str(hit.excerpt) == "no match later <mark>zebras</mark>"


async def test_a_nul_in_a_tool_output_is_indexed_not_refused(chats: Chats):
    conn = chats.conn
    chat_id = await chats.new("c")
    result = ToolResultEntry("call1", "before\u0000after \\u0000literal")
    stored = StoredSegment.encode("r1", [result], None)
    assert "\\u0000" in stored.entries_json  # what jsonb refuses
    await chats.append(chat_id, "r1", UserEntry("run it"), result)
    assert await found(conn, "before") == [chat_id]
    assert await found(conn, "after") == [chat_id]
    assert await found(conn, "u0000literal") == [chat_id]  # typed text stays text
    await chats.archive(chat_id, "r1")
    assert await found(conn, "after") == [chat_id]
    assert await index_rows(conn) == await rebuilt_rows(conn)


async def test_a_document_too_big_for_one_tsvector_is_indexed_by_its_start(chats: Chats):
    chat_id = await chats.new("c")
    tokens = " ".join(f"t{i}x" for i in range(300_000))  # ~3.5 MB of vector
    await chats.append(chat_id, "r1", ToolResultEntry("call1", "needle " + tokens))
    assert await found(chats.conn, "needle") == [chat_id]
    assert await found(chats.conn, "t1000x") == [chat_id]


async def test_the_index_equals_a_rebuild_after_every_operation(chats: Chats):
    conn = chats.conn
    steps: list[str] = []

    async def check(step: str) -> None:
        steps.append(step)
        assert await index_rows(conn) == await rebuilt_rows(conn), steps

    chat_id = await chats.new("c1", title="First chat")
    other = await chats.new("c2")
    await check("new chats")
    await chats.append(chat_id, "r1", UserEntry("alpha"), AssistantEntry("alpha reply"))
    await chats.append(chat_id, "r2", UserEntry("beta"), AssistantEntry("beta reply"))
    await chats.append(other, "r9", UserEntry("other chat"))
    await check("append")
    await chats.archive(chat_id, "r2")
    await chats.append(chat_id, "r3", UserEntry("beta edited"), AssistantEntry("gamma"))
    await check("edit (archive + append)")
    await chats.archive(chat_id, "r3")
    await chats.restore(chat_id, "r2")
    await check("switch")
    trimmed = StoredSegment.encode("r1", [UserEntry("alpha"), AssistantEntry("trimmed")], None)
    await conn.execute(
        "UPDATE session_segments SET entries_json = $1 WHERE session_id = $2 AND run_id = 'r1'",
        trimmed.entries_json,
        chat_id,
    )
    await check("trim")
    await conn.execute("UPDATE chat_runs SET selected = 7 WHERE run_id = 'r3'")
    await conn.execute("UPDATE session_segments SET entries_json = entries_json")
    await check("updates that change no text")
    imported = StoredSegment.encode("i1", [UserEntry("imported delta")], None)
    await chats.new("c3", title="Imported")
    await conn.execute(
        "INSERT INTO chat_runs (run_id, chat_id, message_id, seq, selected, entry_count, "
        "entries_json) VALUES ('i1', 'c3', 'i1', 0, 0, 1, $1)",
        imported.entries_json,
    )
    await check("import (an archived run)")
    await conn.execute("UPDATE chats SET title = 'Renamed' WHERE id = $1", chat_id)
    await check("rename")
    await chats.delete(chat_id)
    await check("delete")
    assert {row[0] for row in await index_rows(conn)} == {other, "c3"}
    assert await found(conn, "delta") == ["c3"]


async def test_the_schema_can_run_again(chats: Chats):
    await chats.conn.execute(chat_search_pg.SCHEMA)
    chat_id = await chats.new("c")
    await chats.append(chat_id, "r1", UserEntry("once"))
    assert len(await index_rows(chats.conn)) == 2  # the title and the run, once each
    assert await found(chats.conn, "once") == [chat_id]


async def test_a_query_typed_with_a_combining_accent_finds_the_composed_word(chats: Chats):
    chat_id = await chats.new("c")
    await chats.append(chat_id, "r1", UserEntry("notre \u00e9cole"))
    assert await found(chats.conn, "e\u0301cole") == [chat_id]  # "e" + COMBINING ACUTE
    assert await found(chats.conn, "e\u0301co") == [chat_id]  # as a prefix too


async def test_private_use_markers_in_a_message_are_not_marks(chats: Chats):
    chat_id = await chats.new("c", "\ue000title\ue001")
    await chats.append(chat_id, "r1", UserEntry("zebras \ue000fake\ue001 mark"))
    [hit] = await hits(chats.conn, "zebras")
    assert str(hit.excerpt) == "<mark>zebras</mark> fake mark"
    [hit] = await hits(chats.conn, "title")
    assert "\ue000" not in str(hit.excerpt) and str(hit.excerpt).count("<mark>") == 1
    assert await index_rows(chats.conn) == await rebuilt_rows(chats.conn)
