"""SPEC §13, password accounts: signing in and out, sessions, throttling, the admin page."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
from pathlib import Path

import httpx
import pytest
from people import HTML, PASSWORD, add_user, execute, http_for, new_chat, person, rows, sign_in
from webhelpers import HX, MakeClient, WebClient, parse_html, undone

from webapp.chats.users import ThrottlePolicy
from webapp.web.auth import SESSION_COOKIE, AuthSettings

SECRET = "aardvark-secret-7731"


async def password_app(make: MakeClient, **kwargs: object) -> WebClient:
    client = await make(auth=AuthSettings("password"), **kwargs)
    await add_user(client, "alice", admin=True)
    await add_user(client, "bob")
    return client


def alert(response: httpx.Response) -> str:
    return parse_html(response.text).find(role="alert").norm_text()


def session_of(response: httpx.Response) -> str:
    found = re.search(rf"{SESSION_COOKIE}=([^;]+)", response.headers.get("set-cookie", ""))
    assert found, response.headers
    return found.group(1)


async def test_a_wrong_name_and_a_wrong_password_get_one_and_the_same_answer(
    web_client_factory: MakeClient,
):
    client = await password_app(web_client_factory)
    await client.web.store.users.set_disabled((await client.web.store.users.find("bob")).id, True)
    answers = []
    async with http_for(client.app) as http:
        for name, password in (
            ("nobody", PASSWORD),  # no such user
            ("alice", "wrong password!"),  # a wrong password
            ("bob", PASSWORD),  # the right password of a disabled account
        ):
            response = await sign_in(http, name, password)
            assert SESSION_COOKIE not in response.headers.get("set-cookie", "")
            answers.append((response.status_code, alert(response)))
    assert answers == [(401, "Wrong user name or password.")] * 3
    assert await rows(client.db, "SELECT * FROM user_sessions") == []


async def test_failures_for_one_name_are_slowed_then_refused_from_any_address(
    web_client_factory: MakeClient,
):
    client = await password_app(web_client_factory)
    policy = ThrottlePolicy()
    took = []
    for attempt in range(policy.refuse_after):  # every guess from an address of its own
        async with http_for(client.app, f"198.51.100.{attempt + 1}") as http:
            started = time.monotonic()
            response = await sign_in(http, "alice", f"guess {attempt}")
            took.append(time.monotonic() - started)
            assert response.status_code == 401
    # The first guesses are answered as fast as a password is checked, the later ones
    # each wait longer. A wait is a lower bound however busy the machine is; the fast
    # ones are held only to the last one's wait on top of a password check (Argon2's
    # own time grows with the machine's load, to half a second and more).
    fast = took[: policy.slow_after]
    longest = (policy.refuse_after - policy.slow_after) * policy.delay
    assert took[policy.slow_after] >= policy.delay * 0.95
    assert took[-1] >= longest * 0.95
    assert min(fast) < took[-1] - longest / 2
    async with http_for(client.app, "198.51.100.200") as http:
        refused = await sign_in(http, "alice", PASSWORD)  # even the right password, now
        assert refused.status_code == 429
        assert "Too many failed sign-ins" in alert(refused)
        assert 0 < int(refused.headers["retry-after"]) <= policy.window
        assert SESSION_COOKIE not in refused.headers.get("set-cookie", "")
        assert (await sign_in(http, "bob")).status_code == 303  # another name is not held up
    counted = await rows(
        client.db, "SELECT failures FROM sign_in_failures WHERE key = ?", "name:alice"
    )
    assert counted == [(policy.refuse_after + 1,)]


async def test_many_names_from_one_address_are_refused_too(web_client_factory: MakeClient):
    policy = ThrottlePolicy(slow_after=1, refuse_after=2, delay=0.01, address_factor=3)
    client = await password_app(web_client_factory, throttle=policy)
    async with http_for(client.app, "203.0.113.9") as http:
        for n in range(policy.refuse_after * policy.address_factor):
            assert (await sign_in(http, f"user{n}", "guess")).status_code == 401
        assert (await sign_in(http, "alice")).status_code == 429
    async with http_for(client.app, "203.0.113.10") as http:  # another address is not
        assert (await sign_in(http, "alice")).status_code == 303


async def test_a_success_clears_the_names_count(web_client_factory: MakeClient):
    policy = ThrottlePolicy(slow_after=1, refuse_after=3, delay=0.01)
    client = await password_app(web_client_factory, throttle=policy)
    async with http_for(client.app) as http:
        for _ in range(2):
            assert (await sign_in(http, "alice", "wrong password!")).status_code == 401
        assert (await sign_in(http, "alice")).status_code == 303
        for _ in range(2):  # counting starts again from nothing
            assert (await sign_in(http, "alice", "wrong password!")).status_code == 401
        assert (await sign_in(http, "alice")).status_code == 303


async def test_every_sign_in_makes_a_new_session_id_and_ends_the_one_it_came_with(
    web_client_factory: MakeClient,
):
    client = await password_app(web_client_factory)
    async with http_for(client.app) as mallory:
        planted = session_of(await sign_in(mallory, "bob"))  # a session the attacker knows
    async with http_for(client.app) as http:
        http.cookies.set(SESSION_COOKIE, planted)  # ... planted in the victim's browser
        first = session_of(await sign_in(http, "alice"))
        assert first != planted
        second = session_of(await sign_in(http, "alice"))
        assert second not in (first, planted)
        assert (await http.get("/", headers=HTML)).status_code == 200
    for ended in (planted, first):
        async with http_for(client.app) as http:
            http.cookies.set(SESSION_COOKIE, ended)
            response = await http.get("/", headers=HTML)
            assert (response.status_code, response.headers["location"]) == (303, "/login?next=/")
    assert len(await rows(client.db, "SELECT id FROM user_sessions")) == 1


async def test_sign_out_ends_the_session_on_the_server_at_once(web_client_factory: MakeClient):
    client = await password_app(web_client_factory)
    async with person(client.app, "alice") as http:
        token = http.cookies[SESSION_COOKIE]
        page = parse_html((await http.get("/", headers=HTML)).text)
        form = next(
            f for f in page.find_all("form") if f.find_all("button") and "Sign out" in f.text()
        )
        assert form.attrs["action"] == "/logout" and form.closest(class_="sidebar")
        out = await http.post("/logout")
        assert (out.status_code, out.headers["location"]) == (303, "/login")
    async with http_for(client.app) as replay:  # the cookie's value, kept by someone
        replay.cookies.set(SESSION_COOKIE, token)
        assert (await replay.get("/", headers=HTML)).status_code == 303
        assert (await replay.post("/chats")).status_code == 401
    assert await rows(client.db, "SELECT * FROM user_sessions") == []


async def test_disable_and_sign_out_everywhere_end_sessions_at_once(
    web_client_factory: MakeClient,
):
    client = await password_app(web_client_factory)
    bob = await client.web.store.users.find("bob")
    assert bob is not None
    async with (
        person(client.app, "alice") as admin,
        person(client.app, "bob") as laptop,
        person(client.app, "bob") as phone,
    ):
        assert (await admin.post(f"/admin/users/{bob.id}/sign-out")).status_code == 303
        for http in (laptop, phone):
            assert (await http.get("/", headers=HX)).status_code == 401
        async with person(client.app, "bob") as again:  # signing in again works
            done = await admin.post(f"/admin/users/{bob.id}/disable")
            assert done.status_code == 303
            assert (await again.get("/", headers=HX)).status_code == 401
            assert (await sign_in(again, "bob")).status_code == 401
        await admin.post(f"/admin/users/{bob.id}/enable")
        async with person(client.app, "bob") as back:
            assert (await back.get("/", headers=HTML)).status_code == 200
        users = parse_html((await admin.get("/admin/users")).text)
        assert [n.norm_text() for n in users.find_all("th", scope="row")] == ["alice (you)", "bob"]


async def test_passwords_are_stored_as_argon2_hashes_and_nothing_else(
    web_client_factory: MakeClient,
):
    client = await password_app(web_client_factory)
    async with person(client.app, "alice") as admin:
        added = await admin.post(
            "/admin/users", data={"name": "Carol", "password": "carol-has-a-password"}
        )
        assert added.status_code == 303
        carol = await client.web.store.users.find("carol")
        assert carol is not None and not carol.is_admin
        await admin.post(f"/admin/users/{carol.id}/password", data={"password": "carol-new-one!"})
        async with http_for(client.app) as http:
            signed = await sign_in(http, "carol", "carol-new-one!")
            assert signed.status_code == 303
            cookie = session_of(signed)
    hashes = await rows(client.db, "SELECT name, password_hash FROM users ORDER BY name")
    assert [name for name, _ in hashes] == ["alice", "bob", "carol"]
    assert all(h.startswith("$argon2id$") for _, h in hashes)
    with contextlib.closing(sqlite3.connect(client.db)) as conn:
        dump = "\n".join(conn.iterdump())
    for secret in (PASSWORD, "carol-has-a-password", "carol-new-one!", cookie):
        assert secret not in dump


async def test_without_a_session_pages_go_to_sign_in_and_nothing_else_answers(
    web_client_factory: MakeClient,
):
    client = await password_app(web_client_factory)
    async with person(client.app, "alice") as alice:
        chat_id = await new_chat(alice)
        await alice.post(f"/chats/{chat_id}/messages", data={"text": SECRET})
        await client.wait_idle(chat_id)
        run_id = (await rows(client.db, "SELECT run_id FROM chat_runs"))[0][0]
    before = await rows(client.db, "SELECT * FROM session_segments")
    async with http_for(client.app) as anonymous:
        page = await anonymous.get(f"/chats/{chat_id}?before=x", headers=HTML)
        assert page.status_code == 303
        assert page.headers["location"] == f"/login?next=/chats/{chat_id}%3Fbefore%3Dx"
        for method, path, headers in (
            ("GET", f"/chats/{chat_id}", HX),  # a fragment
            ("GET", f"/chats/{chat_id}/runs/{run_id}/events", {"Accept": "text/event-stream"}),
            ("GET", f"/chats/{chat_id}/export.json", {}),  # a download, as curl asks
            ("GET", "/search?q=aardvark", HX),
            ("POST", f"/chats/{chat_id}/messages", {}),
            ("POST", f"/chats/{chat_id}/delete", {}),
            ("POST", "/chats", {}),
            ("GET", "/admin/users", HTML | HX),
        ):
            response = await anonymous.request(method, path, headers=headers, data={"text": "x"})
            assert response.status_code == 401, (method, path)
            assert SECRET not in response.text and "aardvark" not in response.text
        assert (await anonymous.get("/static/app.js")).status_code == 200
        login = await anonymous.get("/login")
        labels = [n.norm_text() for n in parse_html(login.text).find_all("label")]
        assert labels == ["User name", "Password"]
        assert [b.norm_text() for b in parse_html(login.text).find_all("button")] == ["Sign in"]
    assert await rows(client.db, "SELECT * FROM session_segments") == before


async def test_the_session_cookie_is_httponly_lax_and_secure_on_https(
    web_client_factory: MakeClient,
):
    made = await web_client_factory(
        auth=AuthSettings("password", trusted_proxies=("127.0.0.1/32",))
    )
    await add_user(made, "alice")
    async with http_for(made.app) as http:
        cookie = (await sign_in(http, "alice")).headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Secure" not in cookie
        through_tls = await http.post(
            "/login",
            data={"name": "alice", "password": PASSWORD},
            headers={"X-Forwarded-Proto": "https"},
        )
        assert "Secure" in through_tls.headers["set-cookie"]
    async with http_for(made.app, "10.1.1.1") as http:  # not a trusted proxy
        spoofed = await http.post(
            "/login",
            data={"name": "alice", "password": PASSWORD},
            headers={"X-Forwarded-Proto": "https"},
        )
        assert "Secure" not in spoofed.headers["set-cookie"]


async def test_sign_in_returns_to_the_page_that_asked_and_only_on_this_site(
    web_client_factory: MakeClient,
):
    client = await password_app(web_client_factory)
    for wanted, went in (
        ("/search?q=x", "/search?q=x"),
        ("//evil.example/", "/"),
        ("/\\evil.example/", "/"),
        ("https://evil.example/", "/"),
    ):
        async with http_for(client.app) as http:
            form = parse_html((await http.get("/login", params={"next": wanted})).text)
            kept = form.find("input", name="next").attrs["value"]
            signed = await http.post(
                "/login", data={"name": "alice", "password": PASSWORD, "next": wanted}
            )
            assert (kept, signed.headers["location"]) == (went, went)


async def test_requests_from_other_sites_are_still_refused(web_client_factory: MakeClient):
    client = await password_app(web_client_factory)
    evil = {"Origin": "https://evil.example"}
    async with http_for(client.app) as http:
        forged = await http.post(
            "/login", data={"name": "alice", "password": PASSWORD}, headers=evil
        )
        assert forged.status_code == 403 and SESSION_COOKIE not in forged.headers.get(
            "set-cookie", ""
        )
    async with person(client.app, "alice") as alice:
        assert (await alice.post("/chats", headers=evil)).status_code == 403
        assert (await alice.post("/logout", headers=evil)).status_code == 403
    assert await rows(client.db, "SELECT id FROM chats") == []


async def test_the_users_page_is_for_administrators_only(web_client_factory: MakeClient):
    client = await password_app(web_client_factory)
    async with person(client.app, "bob") as bob, person(client.app, "alice") as alice:
        await bob.post("/chats", data={"text": SECRET})
        unknown = await bob.get("/no/such/page")
        for method, path in (
            ("GET", "/admin/users"),
            ("POST", "/admin/users"),
            ("POST", f"/admin/users/{(await client.web.store.users.find('alice')).id}/disable"),
        ):
            refused = await bob.request(
                method, path, data={"name": "eve", "password": PASSWORD * 2}
            )
            assert refused.status_code == 404 and alert(refused) == alert(unknown)
        assert await client.web.store.users.find("eve") is None
        listing = await alice.get("/admin/users")
        assert listing.status_code == 200
        assert SECRET not in listing.text  # an administrator reads no one's chats
        home = parse_html((await alice.get("/", headers=HTML)).text)
        assert home.find("a", href="/admin/users").norm_text() == "Users"
        assert SECRET not in (await alice.get("/", headers=HTML)).text
        bad = await alice.post("/admin/users", data={"name": "bob", "password": PASSWORD})
        assert bad.status_code == 400 and "already a user named" in alert(bad)
        short = await alice.post("/admin/users", data={"name": "dave", "password": "short"})
        assert short.status_code == 400 and "at least 8 characters" in alert(short)
        me = await client.web.store.users.find("alice")
        assert (await alice.post(f"/admin/users/{me.id}/disable")).status_code == 400


async def test_chats_from_before_accounts_go_to_the_first_admin(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    before = await web_client_factory(db)  # no accounts: as every database was until now
    old = [await before.new_chat() for _ in range(2)]
    after = await web_client_factory(db, auth=AuthSettings("password"))
    await add_user(after, "early")  # not an admin: takes nothing
    await add_user(after, "root", admin=True)
    await add_user(after, "second", admin=True)
    owners = dict(await rows(db, "SELECT id, user_id FROM chats"))
    root = await after.web.store.users.find("root")
    assert owners == {chat_id: root.id for chat_id in old}
    async with person(after.app, "root") as http:
        listed = parse_html((await http.get("/", headers=HTML)).text).find(
            "nav", aria_label="Chats"
        )
        links = {a.attrs["href"] for a in listed.find_all("a")}
        assert {f"/chats/{c}" for c in old} <= links
    async with person(after.app, "second") as http:
        assert (await http.get(f"/chats/{old[0]}", headers=HTML)).status_code == 404


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_the_auth_mode_defaults_as_before(host: str, monkeypatch: pytest.MonkeyPatch):
    from webapp.__main__ import parse_args

    for name in ("WEBAPP_AUTH", "WEBAPP_TOKEN", "WEBAPP_TRUSTED_PROXIES"):
        monkeypatch.delenv(name, raising=False)
    assert parse_args(["--host", host]).auth == ("none" if host == "127.0.0.1" else "token")
    assert parse_args(["--host", host, "--auth", "password"]).auth == "password"
    monkeypatch.setenv("WEBAPP_AUTH", "password")
    assert parse_args(["--host", host]).auth == "password"
    for refused in (
        ["--auth", "header"],  # no trusted proxies
        ["--auth", "password", "--token", "a-token-of-ours"],
        ["--auth", "sso"],
        ["--max-runs-per-user", "0"],
    ):
        with pytest.raises(SystemExit):
            parse_args(["--host", host, *refused])
    with pytest.raises(SystemExit):
        parse_args(["--host", "0.0.0.0", "--auth", "none"])
    args = parse_args(["--auth", "header", "--trusted-proxies", "10.0.0.1, 192.168.0.0/16"])
    assert (args.auth_header, args.trusted_proxies) == (
        "X-Forwarded-User",
        ["10.0.0.1", "192.168.0.0/16"],
    )


@pytest.mark.parametrize("db_kind", ["sqlite", "postgres"])
async def test_a_database_from_before_accounts_is_migrated_and_its_chats_go_to_the_first_admin(
    web_client_factory: MakeClient, db_kind: str, request: pytest.FixtureRequest, tmp_path: Path
):
    db: Path | str = tmp_path / "chat.db"
    if db_kind == "postgres":
        db = request.getfixturevalue("postgres_dsn")
    old = await web_client_factory(db)
    chats = [await old.new_chat() for _ in range(2)]
    await old.web.store.close()  # (it opens again by itself if asked)
    # Take the schema back to the version before accounts: what an older release left.
    # What came after accounts (share links and projects) goes too; the statements are
    # the same on both back ends, named by SQLite's step numbers.
    before = 6 if db_kind == "postgres" else 10
    for statement in (
        *undone(14, 10),
        f"UPDATE schema_versions SET version = {before} WHERE name = 'webapp_chats'",
    ):
        await execute(db, statement)
    new = await web_client_factory(db, auth=AuthSettings("password"))
    admin = await add_user(new, "root", admin=True)
    owners = await rows(db, "SELECT id, user_id FROM chats ORDER BY id")
    assert owners == sorted((c, admin.id) for c in chats)
    async with person(new.app, "root") as http:
        for chat_id in chats:
            assert (await http.get(f"/chats/{chat_id}", headers=HTML)).status_code == 200
