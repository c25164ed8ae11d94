"""Operating the app (SPEC §17): /healthz, /readyz, /metrics, UTC log lines, JSON logs
and the access log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from people import add_user, http_for, person
from webhelpers import MakeClient, cli_env, free_port, stop_process, wait_serving

from webapp.web import create_app
from webapp.web.auth import AuthSettings

SCRAPER = "scraper-token-0123456789"


def metric(text: str, name: str) -> float:
    """The value of the sample ``name`` (with its labels, as printed) in Prometheus text."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no sample {name} in:\n{text}")


async def test_health_and_readiness_need_no_token_and_say_nothing_of_chats(
    web_client_factory: MakeClient, tmp_path: Path
):
    client = await web_client_factory(token="secret-token-123")
    assert (await client.http.get("/")).status_code == 401  # the app itself needs the token
    health = await client.http.get("/healthz")
    ready = await client.http.get("/readyz")
    assert (health.status_code, health.text) == (200, "ok\n")
    assert (ready.status_code, ready.text) == (200, "ready\n")
    # Before start-up is done (no lifespan has run): alive, but not ready.
    idle = create_app(tmp_path / "other.db")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=idle), base_url="http://testserver"
    ) as http:
        assert (await http.get("/healthz")).status_code == 200
        waiting = await http.get("/readyz")
        assert waiting.status_code == 503 and "starting" in waiting.text


async def test_readiness_fails_while_the_database_does_not_answer(
    web_client_factory: MakeClient,
):
    client = await web_client_factory()
    health = client.web.health

    async def gone() -> None:
        raise OSError("connection refused")

    health.ping, answering = gone, health.ping
    try:
        refused = await client.http.get("/readyz")
        assert refused.status_code == 503 and "database" in refused.text
        assert metric((await client.http.get("/metrics")).text, "webapp_database_errors_total") >= 1
    finally:
        health.ping = answering
    assert (await client.http.get("/readyz")).status_code == 200


async def test_metrics_count_runs_as_they_start_end_and_stop(web_client_factory: MakeClient):
    client = await web_client_factory(offline_delay=0.001)
    chat_id = await client.new_chat()
    before = (await client.http.get("/metrics")).text
    assert metric(before, "webapp_runs_started_total") == 0
    await client.send(chat_id, "hello")
    await client.wait_idle(chat_id)
    after = await client.http.get("/metrics")
    assert after.headers["content-type"].startswith("text/plain")
    text = after.text
    assert metric(text, "webapp_runs_started_total") == 1
    assert metric(text, 'webapp_runs_ended_total{outcome="completed"}') == 1
    assert metric(text, 'webapp_tokens_total{direction="out"}') > 0
    assert metric(text, "webapp_runs_running") == 0
    # A reply that is stopped: running while it runs, then counted as stopped.
    slow = await client.new_chat()
    await client.send(slow, "count to 2000")
    await client.wait_text(slow, 10)
    assert metric((await client.http.get("/metrics")).text, "webapp_runs_running") == 1
    run_id = await client.active_run(slow)
    await client.http.post(f"/chats/{slow}/runs/{run_id}/stop")
    await client.wait_idle(slow)
    text = (await client.http.get("/metrics")).text
    assert metric(text, "webapp_runs_started_total") == 2
    assert metric(text, 'webapp_runs_ended_total{outcome="stopped"}') == 1
    assert metric(text, "webapp_runs_running") == 0
    # Requests are timed by route (its template: no chat id in any label).
    assert 'route="/chats/{chat_id}/messages"' in text and chat_id not in text
    await asyncio.sleep(0.6)
    text = (await client.http.get("/metrics")).text
    assert metric(text, "webapp_event_loop_lag_seconds_count") >= 1  # sampled twice a second
    assert metric(text, "webapp_sse_clients") == 0


async def test_metrics_are_for_administrators_or_the_metrics_token(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(auth=AuthSettings("password"), metrics_token=SCRAPER)
    await add_user(client, "alice")
    await add_user(client, "root", admin=True)
    async with http_for(client.app) as anonymous:
        assert (await anonymous.get("/metrics")).status_code == 401
        wrong = {"Authorization": "Bearer not-the-token-at-all"}
        assert (await anonymous.get("/metrics", headers=wrong)).status_code == 401
        scraped = await anonymous.get("/metrics", headers={"Authorization": f"Bearer {SCRAPER}"})
        assert scraped.status_code == 200 and "webapp_runs_started_total" in scraped.text
    async with person(client.app, "alice") as alice:
        assert (await alice.get("/metrics")).status_code == 404
    async with person(client.app, "root") as root:
        shown = await root.get("/metrics")
        assert shown.status_code == 200 and "webapp_sse_clients" in shown.text


def test_log_lines_are_json_with_utc_times_and_the_access_log_has_one_per_request(
    tmp_path: Path,
):
    with logging_server(tmp_path, WEBAPP_LOG_FORMAT="json", WEBAPP_ACCESS_LOG="1") as (base, log):
        created = httpx.post(base + "/chats", data={"text": "hello"})
        assert created.status_code == 303
        httpx.get(base + "/healthz?token=never-logged")
        wait_logged(log, "completed")
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert lines, "no log line"
    for line in lines:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"]), line
        assert {"level", "logger", "message"} <= set(line)
    access = [line["message"] for line in lines if line["logger"] == "webapp.access"]
    assert any(re.search(r"POST /chats 303 [\d.]+ ms$", m) for m in access), access
    assert not any("never-logged" in m for m in access)  # the query is left out
    runs = [line for line in lines if line["logger"] == "webapp.web.live.runs"]
    assert runs and "completed" in runs[-1]["message"]


@contextlib.contextmanager
def logging_server(tmp_path: Path, **settings: str) -> Iterator[tuple[str, Path]]:
    """A real server whose stderr goes to a file: (its base URL, that file)."""
    port = free_port()
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "webapp", "--port", str(port), "--db", str(tmp_path / "c.db")],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
            env=cli_env(**settings),
            cwd=tmp_path,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_serving(base, proc, log)
            yield base, log
        finally:
            stop_process(proc)


def wait_logged(log: Path, text: str) -> None:
    deadline = time.monotonic() + 20
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"{text!r} was never logged"
        time.sleep(0.05)


def test_text_log_lines_start_with_a_utc_timestamp(tmp_path: Path):
    with logging_server(tmp_path) as (base, log):
        httpx.post(base + "/chats", data={"text": "hello"})
        wait_logged(log, "completed")
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert any("completed" in line for line in lines), lines
    for line in lines:
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [A-Z]+ \S+: ", line), line


def test_the_operations_flags_and_their_environment(monkeypatch, tmp_path: Path):
    from webapp.__main__ import parse_args

    args = parse_args([])
    assert (args.log_format, args.access_log, args.metrics_token, args.db_pool_size) == (
        "text",
        False,
        None,
        20,
    )
    monkeypatch.setenv("WEBAPP_LOG_FORMAT", "json")
    monkeypatch.setenv("WEBAPP_ACCESS_LOG", "1")
    monkeypatch.setenv("WEBAPP_METRICS_TOKEN", SCRAPER)
    monkeypatch.setenv("WEBAPP_DB_POOL_SIZE", "12")
    args = parse_args([])
    assert (args.log_format, args.access_log, args.metrics_token, args.db_pool_size) == (
        "json",
        True,
        SCRAPER,
        12,
    )
    with pytest.raises(ValueError, match="at least 16"):
        create_app(tmp_path / "c.db", metrics_token="short")
