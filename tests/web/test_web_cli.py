"""The CLI: `python -m webapp` serves the app and says where; tokens for non-loopback hosts."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from webhelpers import cli_env, free_port, sigterm_during_a_reply, stop_process, wait_serving

from webapp.__main__ import allowed_hosts, is_loopback, parse_args, resolve_token


def test_loopback_detection_and_tokens():
    for host in ("127.0.0.1", "127.8.9.1", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
        assert resolve_token(host, None) is None
    for host in ("0.0.0.0", "192.168.1.10", "::", "example.com"):
        assert not is_loopback(host), host
        token = resolve_token(host, None)
        assert token is not None and len(token) >= 24
        assert resolve_token(host, None) != token  # generated, not fixed
    assert resolve_token("0.0.0.0", "given-token") == "given-token"
    assert resolve_token("127.0.0.1", "given-token") == "given-token"


def test_a_loopback_server_answers_only_to_loopback_names():
    assert allowed_hosts("127.0.0.1") == ["127.0.0.1", "::1", "localhost"]
    assert allowed_hosts("::1") == ["127.0.0.1", "::1", "localhost"]


def test_flags_fall_back_to_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("WEBAPP_DB", "/tmp/from-env.db")
    monkeypatch.setenv("WEBAPP_MODEL", "m1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "k1")
    monkeypatch.setenv("WEBAPP_TOKEN", "t1-token")
    args = parse_args([])
    assert (args.db, args.model, args.base_url, args.api_key, args.token) == (
        "/tmp/from-env.db", "m1", "http://127.0.0.1:9/v1", "k1", "t1-token",
    )  # fmt: skip
    assert (args.host, args.port, args.offline_delay) == ("127.0.0.1", 8000, 0.02)
    args = parse_args(["--db", "x.db", "--model", "m2", "--port", "9"])
    assert (args.db, args.model, args.port) == ("x.db", "m2", 9)
    for name in ("WEBAPP_DB", "WEBAPP_MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name)
    assert parse_args([]).db == "chat.db"


def test_python_m_webapp_serves_and_prints_one_line(tmp_path: Path):
    port = free_port()
    db = tmp_path / "chat.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "webapp", "--port", str(port), "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == f"webapp: serving http://127.0.0.1:{port} (offline model, db {db})"
        base = f"http://127.0.0.1:{port}"
        wait_serving(base, proc)
        response = httpx.get(base + "/", timeout=2)
        assert response.status_code == 200
        assert "offline model" in response.text
        assert db.exists()
    finally:
        stop_process(proc)
    # uvicorn shuts down gracefully, then re-raises the signal it caught.
    stderr = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode in (0, -signal.SIGTERM), stderr
    assert "Traceback" not in stderr, stderr


def test_a_shutdown_ends_live_event_streams_at_once(tmp_path: Path):
    port = free_port()
    command = [sys.executable, "-m", "webapp", "--port", str(port), "--db", str(tmp_path / "c.db")]
    proc = subprocess.Popen(
        [*command, "--offline-delay", "0.5"],  # a reply that is still streaming at the signal
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
    )
    base = f"http://127.0.0.1:{port}"
    ended, exited, stderr = sigterm_during_a_reply(proc, base)
    # ...well before uvicorn's graceful shutdown (5 s) would have cut it
    assert ended < 3 and exited < 4, (ended, exited)
    assert "Traceback" not in stderr, stderr


def test_bad_settings_exit_with_a_message(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "webapp", "--base-url", "http://127.0.0.1:9/v1", "--db", "x.db"],
        check=False,
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
        timeout=30,
    )
    assert result.returncode == 2
    assert "--model" in result.stderr


def test_logs_are_quiet_by_default_and_the_level_is_a_flag(monkeypatch: pytest.MonkeyPatch):
    # Regression: every model request logged an httpx INFO line.
    import logging

    from webapp.__main__ import configure_logging

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(logging.getLogger("webapp"), "level", logging.NOTSET)
    configure_logging(parse_args([]).log_level)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert logging.getLogger("webapp.web.live.runs").isEnabledFor(logging.INFO)
    configure_logging(parse_args(["--log-level", "warning"]).log_level)
    assert not logging.getLogger("webapp.web.live.runs").isEnabledFor(logging.INFO)
    configure_logging(parse_args(["--log-level", "debug"]).log_level)
    assert logging.getLogger("httpx").isEnabledFor(logging.DEBUG)
    with pytest.raises(SystemExit):
        parse_args(["--log-level", "chatty"])
