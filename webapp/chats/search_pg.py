"""Full-text search over every chat on PostgreSQL: `webapp.chats.search`'s twin.

The same documents as on SQLite -- one per chat title and one per run, wherever
the run's segment lives (the session or the version archive) -- in one table,
``search_docs``, keyed (chat_id, run_id, source), holding each document's text
and its ``tsvector`` (configuration 'simple': no stemming, no stop words, any
language) under a GIN index. Triggers on ``session_segments``, ``chat_runs``
and ``chats`` keep it in step, in the transaction that changed the text, so no
code path can forget the index and a crash can never leave it behind the data.
The newest document (largest ``id``) gives a chat's excerpt, as on SQLite.

Invariants, each named for the failure it prevents:
- a stored segment can always be indexed: ``\\u0000`` (which jsonb rejects) is
  taken out of the JSON before the cast, and a document whose vector would pass
  PostgreSQL's 1 MB limit (long runs of unique tokens: hashes, base64) is indexed
  by its start instead, so an append never fails because of search;
- words split where FTS5's unicode61 splits them: ASCII punctuation becomes a
  space before parsing, so "chat_search.py" or a URL is found by its words, not
  only as one host or file token;
- excerpts show the text as written: ts_headline drops what its parser takes for
  HTML tags (``<b>`` in a message) and marks no word inside a host or a path, so
  it reads the body with a space after each ASCII punctuation mark, and those
  spaces are taken out of its answer again;
- user queries never reach tsquery syntax: each ``\\w+`` word becomes a quoted
  lexeme (the last a prefix, for search as you type), sent as a parameter.

Deliberately absent: diacritic folding (unicode61's ``remove_diacritics``
needs the unaccent extension); non-ASCII case folding follows the database's
locale (none under ``C``).
"""

from __future__ import annotations

import re

from webapp.chats.db import Tx
from webapp.chats.search import (
    _CLOSE,
    _OPEN,
    MAX_RESULTS,
    MIN_PREFIX,
    SearchHit,
    _excerpt,
    query_words,
)
from webapp.chats.users import Owner

_MAX_LEXEME = 2047  # bytes: PostgreSQL indexes no longer word, so none can match
# ASCII punctuation: FTS5 splits words there, PostgreSQL's parser not always (hosts,
# paths, tags). Spelled as ranges: the chat SQL must hold no literal question mark.
_PUNCT = r"[!-/:-@\[-`{-~]"
_CLOSE_UP = re.compile(f"({_PUNCT}) ")  # undoes the headline's spacing (see above)

SCHEMA = rf"""
-- Which text of a segment is searchable: messages, replies, reasoning, tool results.
-- An escaped NUL becomes a space (a separator, as in FTS5); an even run of backslashes
-- before "u0000" is escaped backslashes and text, so it stays.
CREATE OR REPLACE FUNCTION search_text(entries TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT COALESCE(string_agg(COALESCE(e ->> 'text', e ->> 'output', ''), ' ' ORDER BY i), '')
    FROM jsonb_array_elements(
        regexp_replace(entries, '(?<!\\)((?:\\\\)*)\\u0000', '\1 ', 'g')::jsonb
    ) WITH ORDINALITY AS t (e, i)
$$;
CREATE OR REPLACE FUNCTION search_vector(body TEXT) RETURNS tsvector
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    words TEXT := regexp_replace(body, '{_PUNCT}+', ' ', 'g');
BEGIN
    IF octet_length(words) < 200000 THEN  -- a vector takes at most 5 bytes a byte: fits
        RETURN to_tsvector('simple', words);
    END IF;
    LOOP
        BEGIN
            RETURN to_tsvector('simple', words);
        EXCEPTION WHEN program_limit_exceeded THEN  -- over 1 MB: index the start
            words := left(words, length(words) / 2);
        END;
    END LOOP;
END $$;
CREATE TABLE IF NOT EXISTS search_docs (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    chat_id TEXT NOT NULL,
    run_id  TEXT NOT NULL,
    source  TEXT NOT NULL,
    body    TEXT NOT NULL,
    words   tsvector GENERATED ALWAYS AS (search_vector(body)) STORED,
    UNIQUE (chat_id, run_id, source)
);
CREATE INDEX IF NOT EXISTS search_docs_words ON search_docs USING gin (words);

-- A document's text without the excerpt markers: text holding them cannot fake a match.
CREATE OR REPLACE FUNCTION search_plain(body TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT translate(body, chr({ord(_OPEN)}) || chr({ord(_CLOSE)}), '  ')
$$;
CREATE OR REPLACE FUNCTION search_put(chat TEXT, run TEXT, src TEXT, content TEXT) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO search_docs (chat_id, run_id, source, body)
    VALUES (chat, run, src, search_plain(content))
    ON CONFLICT (chat_id, run_id, source) DO UPDATE SET body = excluded.body
$$;
CREATE OR REPLACE FUNCTION search_drop(chat TEXT, run TEXT, src TEXT) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM search_docs WHERE chat_id = chat AND run_id = run AND source = src
$$;

-- The shown path: every segment the session gains, loses or rewrites.
CREATE OR REPLACE FUNCTION search_session_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND (NEW.session_id, NEW.run_id, NEW.entries_json)
            IS NOT DISTINCT FROM (OLD.session_id, OLD.run_id, OLD.entries_json) THEN
        RETURN NULL;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        PERFORM search_drop(OLD.session_id, OLD.run_id, 'session');
    END IF;
    IF TG_OP <> 'DELETE' THEN
        PERFORM search_put(NEW.session_id, NEW.run_id, 'session', search_text(NEW.entries_json));
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER search_session
    AFTER INSERT OR DELETE OR UPDATE OF session_id, run_id, entries_json ON session_segments
    FOR EACH ROW EXECUTE FUNCTION search_session_changed();

-- The other versions: a run's archived segment comes and goes with its moves.
CREATE OR REPLACE FUNCTION search_archive_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND (NEW.chat_id, NEW.run_id, NEW.entries_json)
            IS NOT DISTINCT FROM (OLD.chat_id, OLD.run_id, OLD.entries_json) THEN
        RETURN NULL;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        IF OLD.entries_json IS NOT NULL THEN
            PERFORM search_drop(OLD.chat_id, OLD.run_id, 'archive');
        END IF;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        IF NEW.entries_json IS NOT NULL THEN
            PERFORM search_put(NEW.chat_id, NEW.run_id, 'archive', search_text(NEW.entries_json));
        END IF;
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER search_archive
    AFTER INSERT OR DELETE OR UPDATE OF chat_id, run_id, entries_json ON chat_runs
    FOR EACH ROW EXECUTE FUNCTION search_archive_changed();

-- Titles: renamed in place, so a rename does not make the title the newest document.
CREATE OR REPLACE FUNCTION search_title_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM search_drop(OLD.id, '', 'title');
    ELSIF TG_OP = 'UPDATE' AND OLD.id <> NEW.id THEN
        PERFORM search_drop(OLD.id, '', 'title');
    END IF;
    IF TG_OP <> 'DELETE' THEN
        PERFORM search_put(NEW.id, '', 'title', NEW.title);
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER search_title
    AFTER INSERT OR DELETE OR UPDATE OF id, title ON chats
    FOR EACH ROW EXECUTE FUNCTION search_title_changed();
"""

# Fills the index from what is stored; later runs get larger ids, as appends would.
REBUILD = """
DELETE FROM search_docs;
INSERT INTO search_docs (chat_id, run_id, source, body)
    SELECT id, '', 'title', search_plain(title) FROM chats ORDER BY created_at, id;
INSERT INTO search_docs (chat_id, run_id, source, body)
    SELECT session_id, run_id, 'session', search_plain(search_text(entries_json))
    FROM session_segments ORDER BY session_id, seq;
INSERT INTO search_docs (chat_id, run_id, source, body)
    SELECT chat_id, run_id, 'archive', search_plain(search_text(entries_json)) FROM chat_runs
    WHERE entries_json IS NOT NULL ORDER BY chat_id, seq;
"""

# Excerpts like FTS5's snippet(..., 16): one fragment of up to 16 words around the matches.
_HEADLINE = (
    f'StartSel="{_OPEN}", StopSel="{_CLOSE}", MaxWords=16, MinWords=6, ShortWord=0, MaxFragments=1'
)

# One pass over the matches finds the chats, newest first, each with its latest
# matching document; only those few documents pay for a headline.
_SEARCH = f"""
WITH q AS MATERIALIZED (SELECT to_tsquery('simple', CAST(? AS TEXT)) AS q)
SELECT top.id, top.title, top.updated_at,
    ts_headline('simple', regexp_replace(d.body, '({_PUNCT})', '\\1 ', 'g'), q.q, '{_HEADLINE}')
FROM (
    SELECT c.id, c.title, c.updated_at, found.doc FROM chats c JOIN (
        SELECT d.chat_id, MAX(d.id) AS doc FROM search_docs d, q
        WHERE d.words @@ q.q GROUP BY d.chat_id
    ) found ON found.chat_id = c.id{{owned}}
    ORDER BY c.updated_at DESC, c.id LIMIT ?
) top JOIN search_docs d ON d.id = top.doc CROSS JOIN q
ORDER BY top.updated_at DESC, top.id
"""
_SEARCH_ALL = _SEARCH.replace("{owned}", "")  # no accounts: every chat
_SEARCH_OWNED = _SEARCH.replace("{owned}", " WHERE c.user_id = ?")


def ts_query(text: str) -> str | None:
    """A tsquery matching every word of ``text`` (the last, if long enough, as a
    prefix), or None when it has no words or one too long for any document to hold."""
    words = query_words(text)
    if not words or any(len(w.encode()) > _MAX_LEXEME for w in words):
        return None
    # \w+ holds no quote or backslash; escaped anyway, so the quoting never depends on it.
    quoted = ["'" + w.replace("\\", "\\\\").replace("'", "''") + "'" for w in words]
    if len(words[-1]) >= MIN_PREFIX:
        quoted[-1] += ":*"  # still typing: "pyth" finds "python"
    return " & ".join(quoted)


async def search(tx: Tx, text: str, owner: Owner) -> list[SearchHit]:
    """``owner``'s chats whose title or any message (any version) matches, most recently
    active first."""
    query = ts_query(text)
    if query is None:
        return []
    if owner.user_id is None:
        rows = await tx.fetch(_SEARCH_ALL, (query, MAX_RESULTS))
    else:
        rows = await tx.fetch(_SEARCH_OWNED, (query, owner.user_id, MAX_RESULTS))
    return [
        SearchHit(str(chat), str(title), float(at), _excerpt(_CLOSE_UP.sub(r"\1", headline)))
        for chat, title, at, headline in rows
    ]
