"""API keys (SPEC §16): the API keys page and the CLI, stored hashed, revoked at once;
the token of --auth token is a key; each person's idempotency keys are their own;
limits answer 429."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from chat_server import ChatServer, Reply, chunk, text_reply
from conftest import MODEL, serve
from webhelpers import cli_env, parse_html

PASSWORD = "correct horse battery staple"
USER = [{"role": "user", "content": "Hi"}]


def webapp(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webapp", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
        check=False,
    )


def client(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def accounts(
    tmp_path_factory: pytest.TempPathFactory, _upstream: ChatServer
) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("keys")
    db = folder / "chat.db"
    for name in ("alice", "bob"):
        made = webapp("users", "add", name, "--password-stdin", "--db", str(db), stdin=PASSWORD)
        assert made.returncode == 0, made.stderr
    with serve(db, _upstream, "--auth", "password", log=folder / "server.log") as (base, _):
        yield base, db


def make_key_on_the_page(base: str, name: str, label: str) -> tuple[httpx.Client, str]:
    http = httpx.Client(base_url=base, timeout=20)
    assert http.post("/login", data={"name": name, "password": PASSWORD}).status_code == 303
    home = parse_html(http.get("/").text)
    link = next(a for a in home.find_all("a") if a.norm_text() == "API keys")
    page = parse_html(http.get(link.attrs["href"]).text)
    assert page.find("label", **{"for": "key-name"}).norm_text() == "Key name"
    assert page.find("button", type="submit", **{"class": "primary"}).norm_text() == "Create key"
    made = http.post(link.attrs["href"], data={"label": label})
    assert made.status_code == 200 and made.headers["cache-control"] == "no-store"
    key = parse_html(made.text).find("code", id="new-key").norm_text()
    again = http.get(link.attrs["href"]).text
    assert key not in again and label in again  # shown once; listed by its name
    return http, key


def test_a_key_made_on_the_page_works_until_it_is_revoked(
    accounts: tuple[str, Path], upstream: ChatServer
):
    base, db = accounts
    http, key = make_key_on_the_page(base, "alice", "my script")
    upstream.script.append(text_reply("Hello"))
    answer = client(base, key).chat.completions.create(model=MODEL, messages=USER)
    assert answer.choices[0].message.content == "Hello"
    with sqlite3.connect(db) as conn:  # stored hashed, never as it is
        stored = [r[0] for r in conn.execute("SELECT key_hash FROM api_keys")]
    assert hashlib.sha256(key.encode()).hexdigest() in stored
    assert not any(key in s for s in stored)
    page = parse_html(http.get("/api-keys").text)
    row = page.find("tr", **{"data-key-id": True})
    revoke = row.find("button")
    assert revoke.norm_text() == "Revoke"
    form = row.find("form")
    assert http.post(form.attrs["action"]).status_code == 303
    with pytest.raises(openai.AuthenticationError) as refused:
        client(base, key).chat.completions.create(model=MODEL, messages=USER)
    assert refused.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    assert len(upstream.received) == 1


def test_without_a_key_or_with_a_wrong_one_401(accounts: tuple[str, Path], upstream: ChatServer):
    base, _ = accounts
    missing = httpx.post(base + "/v1/chat/completions", json={"model": MODEL, "messages": USER})
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "missing_api_key"
    with pytest.raises(openai.AuthenticationError):
        client(base, "wa-not-a-key").models.list()
    assert upstream.received == []


def test_the_cli_makes_a_key(accounts: tuple[str, Path], upstream: ChatServer):
    base, db = accounts
    made = webapp("users", "api-key", "bob", "deploy bot", "--db", str(db))
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert [m.id for m in client(base, key).models.list().data] == [MODEL]
    unknown = webapp("users", "api-key", "nobody", "x", "--db", str(db))
    assert unknown.returncode == 2 and "no user" in unknown.stderr


def test_one_idempotency_key_from_two_people_is_two_runs(
    accounts: tuple[str, Path], upstream: ChatServer
):
    base, db = accounts
    keys = [
        webapp("users", "api-key", name, "k", "--db", str(db)).stdout.strip()
        for name in ("alice", "bob")
    ]
    upstream.script += [text_reply("For alice"), text_reply("For bob")]
    headers = {"Idempotency-Key": "shared"}
    answers = [
        client(base, key).chat.completions.create(model=MODEL, messages=USER, extra_headers=headers)
        for key in keys
    ]
    assert [a.choices[0].message.content for a in answers] == ["For alice", "For bob"]
    assert answers[0].id != answers[1].id
    assert len(upstream.received) == 2
    # And neither can read or cancel the other's run.
    other = answers[0].id.removeprefix("chatcmpl-")
    refused = httpx.get(
        f"{base}/v1/runs/{other}/events", headers={"Authorization": f"Bearer {keys[1]}"}
    )
    assert refused.status_code == 404


def test_the_token_is_a_key_and_a_limit_answers_429(tmp_path: Path, upstream: ChatServer):
    flags = ("--auth", "token", "--token", "a-secret-token", "--max-runs-per-user", "1")
    with serve(tmp_path / "chat.db", upstream, *flags, log=tmp_path / "server.log") as (base, _):
        with pytest.raises(openai.AuthenticationError):
            client(base, "wrong-token").models.list()
        api = client(base, "a-secret-token")
        upstream.script.append(
            Reply(
                body=[chunk({"role": "assistant", "content": ""}), chunk({"content": "x"})], hold=10
            )
        )
        stream = api.chat.completions.create(model=MODEL, messages=USER, stream=True)
        chunks = iter(stream)
        while not next(chunks).choices[0].delta.content:  # the model's "x": it runs
            pass
        with pytest.raises(openai.RateLimitError) as limited:
            api.chat.completions.create(model=MODEL, messages=USER)
        assert limited.value.body["code"] == "runs_limit"  # type: ignore[index]
        assert len(upstream.received) == 1
        stream.close()
