"""The host names the CLI's server answers to, for every bind, token or not."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from webhelpers import cli_env, free_port, stop_process, wait_serving

from webapp import __main__ as cli
from webapp.__main__ import Machine, allowed_hosts, parse_args, this_machine

TOKEN = "a-long-enough-token"
BOX = Machine(frozenset({"box", "box.lan"}), frozenset({"192.168.1.10", "fd00::10"}))
LOOPBACK = ["127.0.0.1", "::1", "localhost"]


def test_a_loopback_bind_answers_to_loopback_names(monkeypatch: pytest.MonkeyPatch):
    def no_lookup() -> Machine:
        raise AssertionError("a loopback bind needs no look-up of the machine's names")

    monkeypatch.setattr(cli, "this_machine", no_lookup)
    for host in ("127.0.0.1", "::1", "[::1]", "localhost"):
        assert allowed_hosts(host) == LOOPBACK, host
    assert allowed_hosts("127.0.0.2") == ["127.0.0.1", "127.0.0.2", "::1", "localhost"]


def test_a_specific_address_answers_to_itself_and_the_machine_names():
    assert allowed_hosts("192.168.1.10", machine=BOX) == ["192.168.1.10", "box", "box.lan"]
    assert allowed_hosts("[fd00::10]", machine=BOX) == ["box", "box.lan", "fd00::10"]
    assert allowed_hosts("Chat.Example.COM", machine=BOX) == ["box", "box.lan", "chat.example.com"]


def test_an_any_address_bind_answers_to_the_machine_and_loopback():
    everything = ["box", "box.lan", "fd00::10", "192.168.1.10", *LOOPBACK]
    for host in ("0.0.0.0", "::", "[::]"):
        bound = host.strip("[]")
        assert allowed_hosts(host, machine=BOX) == sorted({bound, *everything}), host


def test_allowed_hosts_adds_names_and_star_allows_any():
    assert allowed_hosts("127.0.0.1", extra=["chat.example.com", "[FD00::1]"]) == sorted(
        ["chat.example.com", "fd00::1", *LOOPBACK]
    )
    assert allowed_hosts("10.0.0.5", extra=["proxy.internal"], machine=BOX) == [
        "10.0.0.5", "box", "box.lan", "proxy.internal",
    ]  # fmt: skip
    assert allowed_hosts("0.0.0.0", extra=["*"], machine=BOX) is None
    assert allowed_hosts("127.0.0.1", extra=["x.example", "*"]) is None


def test_this_machine_knows_its_own_name():
    machine = this_machine()
    assert socket.gethostname().lower() in machine.names
    hosts = allowed_hosts("0.0.0.0", machine=machine)
    assert hosts is not None
    assert socket.gethostname().lower() in hosts and set(LOOPBACK) <= set(hosts)


def test_the_allowed_hosts_flag_and_its_environment_variable(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("WEBAPP_ALLOWED_HOSTS", raising=False)
    assert parse_args([]).allowed_hosts == []
    args = parse_args(["--allowed-hosts", " Chat.Example.com, 10.0.0.5,[::1],,"])
    assert args.allowed_hosts == ["chat.example.com", "10.0.0.5", "[::1]"]
    assert parse_args(["--allowed-hosts", "*"]).allowed_hosts == ["*"]
    monkeypatch.setenv("WEBAPP_ALLOWED_HOSTS", "a.example,b.example")
    assert parse_args([]).allowed_hosts == ["a.example", "b.example"]
    assert parse_args(["--allowed-hosts", "c.example"]).allowed_hosts == ["c.example"]


@pytest.mark.parametrize(
    "bad", ["http://chat.example.com", "chat.example.com:8000", "a b", "x/y", "-x.example"]
)
def test_a_malformed_allowed_host_is_refused(bad: str, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--allowed-hosts", f"ok.example,{bad}"])
    assert exit_info.value.code == 2
    assert "is not a host name or address" in capsys.readouterr().err


def test_a_token_server_refuses_a_foreign_host(tmp_path: Path):
    """A token used to mean "any Host": a forged one was reflected into redirects."""
    port = free_port()
    command = [sys.executable, "-m", "webapp", "--port", str(port), "--token", TOKEN]
    proc = subprocess.Popen(
        [*command, "--db", str(tmp_path / "chat.db")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(WEBAPP_ALLOWED_HOSTS="chat.example.com"),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_serving(base, proc)
        url = f"{base}/?token={TOKEN}"
        foreign = httpx.get(url, headers={"Host": "evil.example"}, timeout=5)
        assert foreign.status_code == 400
        assert "location" not in foreign.headers
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "chat.example.com"):
            response = httpx.get(url, headers={"Host": host}, timeout=5)
            assert response.status_code == 303, host
            assert response.headers["location"] == "/"
    finally:
        stop_process(proc)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert "Traceback" not in stderr, stderr
