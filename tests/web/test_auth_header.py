"""SPEC §13, trusted header sign-in: the header counts only from the proxy's own address."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from people import HTML, http_for, rows
from webhelpers import MakeClient, cli_env, free_port, parse_html, stop_process, wait_serving

from webapp.web.auth import AuthSettings

PROXY = "10.0.0.1"


async def test_the_header_from_the_proxy_is_that_person_created_on_first_sight(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(auth=AuthSettings("header", trusted_proxies=(f"{PROXY}/32",)))
    async with http_for(client.app, PROXY) as proxy:
        carol = {"X-Forwarded-User": "Carol", "X-Forwarded-For": "203.0.113.7"}
        created = await proxy.post("/chats", headers=carol)
        assert created.status_code == 303
        page = await proxy.get(created.headers["location"], headers={**carol, **HTML})
        assert page.status_code == 200
        assert "Signed in as carol" in parse_html(page.text).find(class_="account").norm_text()
        assert "Sign out" not in page.text  # signing out is the proxy's business
        dave = await proxy.get(created.headers["location"], headers={"X-Forwarded-User": "dave"})
        assert dave.status_code == 404  # another person: not their chat
        assert (await proxy.get("/", headers=HTML)).status_code == 401  # no header, no one
    users = await rows(client.db, "SELECT name, password_hash, is_admin FROM users ORDER BY name")
    assert users == [("carol", None, 0), ("dave", None, 0)]
    owners = await rows(client.db, "SELECT u.name FROM chats c JOIN users u ON u.id = c.user_id")
    assert owners == [("carol",)]


async def test_the_header_from_any_other_address_is_ignored_and_refused(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(auth=AuthSettings("header", trusted_proxies=(f"{PROXY}/32",)))
    for address, extra in (
        ("10.0.0.2", {}),
        ("127.0.0.1", {}),  # a local process is not the proxy either
        ("10.0.0.2", {"X-Forwarded-For": PROXY}),  # nor one that says it is
    ):
        async with http_for(client.app, address) as http:
            headers = {"X-Forwarded-User": "mallory", **extra, **HTML}
            for method, path in (("GET", "/"), ("POST", "/chats"), ("GET", "/login")):
                refused = await http.request(method, path, headers=headers)
                assert refused.status_code == 401, (address, method, path)
                assert "proxy" in parse_html(refused.text).find(role="alert").norm_text()
    assert await rows(client.db, "SELECT * FROM users") == []
    assert await rows(client.db, "SELECT * FROM chats") == []


async def test_a_disabled_account_is_refused_even_through_the_proxy(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(auth=AuthSettings("header", trusted_proxies=(f"{PROXY}/32",)))
    async with http_for(client.app, PROXY) as proxy:
        assert (await proxy.get("/", headers={"X-Forwarded-User": "erin"})).status_code == 200
        erin = await client.web.store.users.find("erin")
        assert erin is not None
        await client.web.store.users.set_disabled(erin.id, True)
        refused = await proxy.get("/", headers={"X-Forwarded-User": "erin"})
        assert refused.status_code == 403 and "disabled" in refused.text
        odd = await proxy.get("/", headers={"X-Forwarded-User": "not a name"})
        assert odd.status_code == 403


def _serve_cli(tmp_path: Path, trusted: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    command = [sys.executable, "-m", "webapp", "--port", str(port), "--db", str(tmp_path / "c.db")]
    command += ["--auth", "header", "--trusted-proxies", trusted]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
    )
    base = f"http://127.0.0.1:{port}"
    wait_serving(base, proc)
    return proc, base


def test_the_server_trusts_forwarded_addresses_only_from_the_trusted_proxies(tmp_path: Path):
    """uvicorn on its own believes X-Forwarded-For from 127.0.0.1: a local process could
    then claim to be the proxy. The CLI's server believes only --trusted-proxies."""
    forged = {"X-Forwarded-For": "10.9.9.9", "X-Forwarded-User": "mallory", **HTML}
    proc, base = _serve_cli(tmp_path, "10.9.9.9/32")
    try:
        refused = httpx.get(base + "/", headers=forged, timeout=5)
        assert refused.status_code == 401
    finally:
        stop_process(proc)
    proc, base = _serve_cli(tmp_path, "127.0.0.1/32")  # now the local peer is the proxy
    try:
        honoured = httpx.get(base + "/", headers=forged, timeout=5)
        assert honoured.status_code == 200 and "mallory" in honoured.text
    finally:
        stop_process(proc)
