"""A run always ends (SPEC §17): when its outcome cannot be recorded, the chat is released,
the run marked failed with the reason, and the person can go on."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from people import execute, rows
from webhelpers import MakeClient, replies

ON_BOTH_DATABASES = True

# The database refuses the run's usage, every time (as a full disk or a bad figure would).
REFUSE_USAGE = """
CREATE TRIGGER refuse_usage BEFORE UPDATE OF tokens_in ON chat_runs
BEGIN SELECT RAISE(ABORT, 'the disk is full'); END;
"""
POSTGRES_REFUSE_USAGE = (
    (
        "CREATE FUNCTION refuse_usage() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'the disk is full'; END $$"
    ),
    (
        "CREATE TRIGGER refuse_usage BEFORE UPDATE OF tokens_in ON chat_runs "
        "FOR EACH ROW EXECUTE FUNCTION refuse_usage()"
    ),
)


async def refuse_usage(db: Path | str) -> None:
    if isinstance(db, str) and db.startswith("postgresql://"):
        for statement in POSTGRES_REFUSE_USAGE:
            await execute(db, statement)
        return
    with sqlite3.connect(db) as conn:
        conn.executescript(REFUSE_USAGE)


async def test_a_run_whose_outcome_cannot_be_recorded_releases_its_chat(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(offline_delay=0)
    chat_id = await client.new_chat()
    await refuse_usage(client.db)
    assert (await client.send(chat_id, "hello")).status_code == 303
    await client.wait_idle(chat_id)  # on main: active for good, every Send a 409
    [(meta,)] = await rows(client.db, "SELECT meta_json FROM session_segments")
    assert '"status": "failed"' in meta.replace('":"', '": "') and "the disk is full" in meta
    page = await client.page(chat_id)
    [failed] = replies(page)
    assert "could not be saved" in failed.norm_text() and "the disk is full" in failed.norm_text()
    assert "hello" in page.norm_text()  # the person's message is kept
    # The chat is free: the next message is taken (and ends, the same way).
    assert (await client.send(chat_id, "again")).status_code == 303
    await client.wait_idle(chat_id)
    assert len(await rows(client.db, "SELECT run_id FROM chat_runs")) == 2
    assert (await rows(client.db, "SELECT COUNT(*) FROM checkpoint_heads")) == [(0,)]


async def test_a_database_error_while_a_run_ends_is_tried_again(web_client_factory: MakeClient):
    client = await web_client_factory(offline_delay=0)
    chat_id = await client.new_chat()

    failures = [OSError("the connection to the database was reset")]

    store = client.web.store
    original = store.end_run

    async def flaky(chat: str, run: str) -> None:
        if failures:
            raise failures.pop()
        await original(chat, run)

    store.end_run = flaky  # type: ignore[method-assign]

    assert (await client.send(chat_id, "hello")).status_code == 303
    await client.wait_idle(chat_id)
    assert not failures
    [(tokens_in,)] = await rows(client.db, "SELECT tokens_in FROM chat_runs")
    assert tokens_in and tokens_in > 0  # recorded as usual, on the second attempt
    [(meta,)] = await rows(client.db, "SELECT meta_json FROM session_segments")
    assert meta is None
