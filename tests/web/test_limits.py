"""SPEC §13 limits: replies running at once and tokens a day, per person; 429 writes nothing."""

from __future__ import annotations

import time

from people import HTML, add_user, execute, new_chat, person, rows, snapshot
from webhelpers import HX, MakeClient, WebClient, parse_html, textarea_value

from webapp.chats.limits import Limits
from webapp.web.auth import AuthSettings

ON_BOTH_DATABASES = True  # every test here that builds the app runs on SQLite and PostgreSQL

LONG = "count to 2000"  # the offline model takes a while: still running when it matters


async def limited_app(make: MakeClient, limits: Limits) -> WebClient:
    client = await make(auth=AuthSettings("password"), limits=limits, offline_delay=0.01)
    await add_user(client, "alice")
    await add_user(client, "bob")
    return client


def notice(text: str) -> str:
    return parse_html(text).find(role="alert").norm_text()


async def test_replies_running_at_once_are_limited_per_person(web_client_factory: MakeClient):
    client = await limited_app(web_client_factory, Limits(max_runs=1))
    async with person(client.app, "alice") as alice, person(client.app, "bob") as bob:
        busy, other = await new_chat(alice), await new_chat(alice)
        assert (await alice.post(f"/chats/{busy}/messages", data={"text": LONG})).status_code == 303
        before = await snapshot(client.db)
        for headers in (HX, HTML):
            refused = await alice.post(
                f"/chats/{other}/messages", data={"text": "one more"}, headers=headers
            )
            assert refused.status_code == 429
            assert "at most 1 of your replies may run at once" in notice(refused.text)
            if headers is HTML:  # the plain form gets its text back in the box
                assert textarea_value(parse_html(refused.text), "Message") == "one more"
        first = await alice.post("/chats", data={"text": "a new chat"})  # its first message
        assert first.status_code == 429
        assert await snapshot(client.db) == before  # nothing written, not even a chat
        # Another person is not held up by Alice's reply.
        theirs = await new_chat(bob)
        assert (await bob.post(f"/chats/{theirs}/messages", data={"text": "hi"})).status_code == 303
        await client.wait_idle(theirs)
        # Once Alice's reply is stopped she may send again.
        run_id = await client.active_run(busy)
        await alice.post(f"/chats/{busy}/runs/{run_id}/stop")
        await client.wait_idle(busy)
        assert (
            await alice.post(f"/chats/{other}/messages", data={"text": "now"})
        ).status_code == 303
        await client.wait_idle(other)


async def test_regenerate_edit_and_continue_count_as_replies_too(web_client_factory: MakeClient):
    client = await limited_app(web_client_factory, Limits(max_runs=1))
    async with person(client.app, "alice") as alice:
        done, busy = await new_chat(alice), await new_chat(alice)
        await alice.post(f"/chats/{done}/messages", data={"text": "hello"})
        await client.wait_idle(done)
        run_id = (await rows(client.db, "SELECT run_id FROM chat_runs WHERE chat_id = ?", done))[0][
            0
        ]
        await alice.post(f"/chats/{busy}/messages", data={"text": LONG})
        before = await snapshot(client.db)
        for path, data in (
            (f"/chats/{done}/regenerate", {"run_id": run_id}),
            (f"/chats/{done}/messages/{run_id}/edit", {"text": "hello again"}),
        ):
            refused = await alice.post(path, data=data, headers=HX)
            assert refused.status_code == 429, path
        assert await snapshot(client.db) == before
        active = await client.active_run(busy)
        await alice.post(f"/chats/{busy}/runs/{active}/stop")
        await client.wait_idle(busy)


async def test_tokens_a_day_are_limited_per_person_until_midnight_utc(
    web_client_factory: MakeClient,
):
    client = await limited_app(web_client_factory, Limits(max_tokens_per_day=100))
    async with person(client.app, "alice") as alice, person(client.app, "bob") as bob:
        chat_id = await new_chat(alice)
        await alice.post(f"/chats/{chat_id}/messages", data={"text": "hello"})
        await client.wait_idle(chat_id)
        # The reply's usage, as the endpoint reported it (SPEC §12): yesterday's counts
        # for nothing today ...
        yesterday = time.time() - 86400 - 60
        await execute(
            client.db,
            "UPDATE chat_runs SET tokens_in = 70, tokens_out = 40, finished_at = ?",
            yesterday,
        )
        sent = await alice.post(f"/chats/{chat_id}/messages", data={"text": "more"})
        assert sent.status_code == 303
        await client.wait_idle(chat_id)
        # ... today's does (the second reply's own counts left out: just the first's).
        await execute(
            client.db,
            "UPDATE chat_runs SET tokens_in = NULL, tokens_out = NULL WHERE finished_at > ?",
            yesterday + 1,
        )
        await execute(client.db, "UPDATE chat_runs SET finished_at = ?", time.time())
        before = await snapshot(client.db)
        refused = await alice.post(f"/chats/{chat_id}/messages", data={"text": "again"}, headers=HX)
        assert refused.status_code == 429
        said = notice(refused.text)
        assert "100 tokens a day" in said and "110 today" in said and "00:00 UTC" in said
        left = int(refused.headers["retry-after"])
        assert (
            left == int(86400 - time.time() % 86400)
            or abs(left - (86400 - time.time() % 86400)) < 5
        )
        assert await snapshot(client.db) == before
        theirs = await new_chat(bob)  # Bob's day is his own
        assert (await bob.post(f"/chats/{theirs}/messages", data={"text": "hi"})).status_code == 303
        await client.wait_idle(theirs)


async def test_without_accounts_the_limits_are_the_one_users(web_client_factory: MakeClient):
    client = await web_client_factory(limits=Limits(max_runs=1), offline_delay=0.01)
    busy, other = await client.new_chat(), await client.new_chat()
    await client.send(busy, LONG)
    refused = await client.send(other, "one more", htmx=True)
    assert refused.status_code == 429
    active = await client.active_run(busy)
    await client.http.post(f"/chats/{busy}/runs/{active}/stop")
    await client.wait_idle(busy)
