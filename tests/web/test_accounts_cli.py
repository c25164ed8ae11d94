"""SPEC §13 from the command line: `webapp users ...`, and real processes sharing accounts.

Two `python -m webapp --auth password` processes on one PostgreSQL database share
everything about people: a session opened through one is honoured by the other,
a sign-out or a disable through one ends it in both at once, the failed sign-in
counters count both processes' attempts, and the limit on replies running at
once holds across them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from people import HTML, PASSWORD, rows
from webhelpers import HX, cli_env, free_port, parse_html, stop_process, wait_serving


def webapp(
    *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webapp", *args],
        input=stdin,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
        cwd=cwd,
    )


@contextmanager
def serving(db: str, *flags: str, cwd: Path) -> Iterator[str]:
    port = free_port()
    command = [sys.executable, "-m", "webapp", "--port", str(port), "--db", db, *flags]
    log = cwd / f"server-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=cli_env(), cwd=cwd
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_serving(base, proc, log)
        yield base
    finally:
        stop_process(proc)


@contextmanager
def signed_in(base: str, name: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, timeout=20) as http:
        response = http.post("/login", data={"name": name, "password": PASSWORD})
        assert response.status_code == 303, response.text
        yield http


def test_users_are_added_listed_changed_and_removed(tmp_path: Path):
    db = str(tmp_path / "chat.db")
    added = webapp(
        "users", "add", "Alice", "--admin", "--password-stdin", "--db", db, stdin=PASSWORD + "\n"
    )
    assert (added.returncode, added.stdout.strip()) == (0, "webapp users: added alice (admin)")
    assert (
        webapp("users", "add", "bob", "--password-stdin", "--db", db, stdin=PASSWORD).returncode
        == 0
    )
    again = webapp("users", "add", "bob", "--password-stdin", "--db", db, stdin=PASSWORD)
    assert again.returncode == 2 and "already a user named 'bob'" in again.stderr
    short = webapp("users", "add", "carol", "--password-stdin", "--db", db, stdin="short\n")
    assert short.returncode == 2 and "at least 8 characters" in short.stderr
    listed = webapp("users", "list", "--db", db)
    assert listed.stdout.splitlines() == ["alice (admin)", "bob"]
    changed = webapp(
        "users", "set-password", "bob", "--password-stdin", "--db", db, stdin="a new password\n"
    )
    assert changed.returncode == 0
    hashes = asyncio.run(rows(db, "SELECT password_hash FROM users ORDER BY name"))
    assert all(h.startswith("$argon2id$") for (h,) in hashes) and hashes[0] != hashes[1]

    # An exported chat goes to the user named, and once there are users, a name is needed.
    export = {"format_version": 1, "title": "old notes", "runs": []}
    (tmp_path / "chat.json").write_text(json.dumps(export))
    nameless = webapp("import", str(tmp_path / "chat.json"), "--db", db)
    assert nameless.returncode == 2 and "--user NAME" in nameless.stderr
    assert (
        webapp("import", str(tmp_path / "chat.json"), "--db", db, "--user", "bob").returncode == 0
    )
    owners = asyncio.run(rows(db, "SELECT u.name FROM chats c JOIN users u ON u.id = c.user_id"))
    assert owners == [("bob",)]
    removed = webapp("users", "remove", "bob", "--db", db)
    assert removed.stdout.strip() == "webapp users: removed bob and 1 chat"
    assert asyncio.run(rows(db, "SELECT id FROM chats")) == []
    assert webapp("users", "list", "--db", db).stdout.splitlines() == ["alice (admin)"]
    missing = webapp("users", "remove", "bob", "--db", db)
    assert missing.returncode == 2 and "no user named 'bob'" in missing.stderr


def test_two_processes_on_postgresql_share_sessions_counters_and_limits(
    postgres_dsn: str, tmp_path: Path
):
    for name, admin in (("alice", ["--admin"]), ("bob", [])):
        made = webapp(
            "users", "add", name, *admin, "--password-stdin", "--db", postgres_dsn, stdin=PASSWORD
        )
        assert made.returncode == 0, made.stderr
    flags = ("--auth", "password", "--max-runs-per-user", "1", "--offline-delay", "0.01")
    with (
        serving(postgres_dsn, *flags, cwd=tmp_path) as a,
        serving(postgres_dsn, *flags, cwd=tmp_path) as b,
    ):
        # A session opened through A is good on B ...
        with signed_in(a, "alice") as alice_a, httpx.Client(base_url=b, timeout=20) as alice_b:
            alice_b.cookies = alice_a.cookies
            page = alice_b.get("/", headers=HTML)
            account = parse_html(page.text).find(class_="account").norm_text()
            assert page.status_code == 200 and account.startswith("Signed in as alice")
            # ... a reply running through A counts against a send through B ...
            busy = alice_a.post("/chats", data={"text": "count to 5000"}).headers["location"]
            other = alice_b.post("/chats").headers["location"]
            refused = alice_b.post(f"{other}/messages", data={"text": "hi"}, headers=HX)
            assert refused.status_code == 429
            run_id = (
                parse_html(alice_a.get(busy).text)
                .find_all(data_role="assistant")[-1]
                .attrs["data-run-id"]
            )
            assert alice_b.post(f"{busy}/runs/{run_id}/stop").status_code == 303
            # ... and signing out through B ends it on A at once.
            assert alice_b.post("/logout").status_code == 303
            assert alice_a.get("/", headers=HX).status_code == 401
        # Failed sign-ins through either process count in one place.
        for base in (a, b, a):
            with httpx.Client(base_url=base, timeout=20) as http:
                assert (
                    http.post("/login", data={"name": "bob", "password": "guess!"}).status_code
                    == 401
                )
        counted = asyncio.run(
            rows(postgres_dsn, "SELECT failures FROM sign_in_failures WHERE key = ?", "name:bob")
        )
        assert counted == [(3,)]
        # A disable through one process ends the sessions another one serves.
        with signed_in(a, "bob") as bob_a, signed_in(b, "alice") as admin_b:
            bob_id = asyncio.run(rows(postgres_dsn, "SELECT id FROM users WHERE name = ?", "bob"))[
                0
            ][0]
            assert admin_b.post(f"/admin/users/{bob_id}/disable").status_code == 303
            assert bob_a.get("/", headers=HX).status_code == 401
