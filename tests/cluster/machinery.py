"""Real processes for the multi-process tests: app processes on one PostgreSQL, and nginx.

`ClusterApp` is the browser tests' `AppServer` (tests/web/browser/harness.py)
pointed at a ``postgresql://`` URL instead of a SQLite file; any number of
them share one schema. `Apps` starts them (and nginx) and ends them all at
teardown with `stop_all`: SIGTERM to all at once, then SIGKILL to any left,
so a failing test does not wait for each in turn. `Nginx` runs a private
nginx (its own config, pid, logs and temp dirs in a temp folder, ``daemon
off`` in a subprocess, a free port) in front of them with round-robin
balancing, never the service Debian's package may have started. The SSE
helpers read a run's event stream over HTTP the way a browser's EventSource
does (``Last-Event-ID``), noting when each event arrived.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, NoReturn, TypeVar
from urllib.parse import unquote

import httpx
import pytest

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS / "web") not in sys.path:  # the browser harness and the SSE parser live there
    sys.path.insert(0, str(TESTS / "web"))

from browser import ui  # noqa: F401  # re-exported: what a user sees and does
from browser.harness import STOP_TIMEOUT, AppServer, free_port
from webhelpers import Node, SSEvent, parse_html, parse_sse

PHASE_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()  # filled by conftest's hook
HTTP_TIMEOUT = 10.0
STREAM_TIMEOUT = 60.0  # the longest any test reads one event stream
# Leases last this long unrenewed (--lease-seconds): a dead process's runs are taken
# over within seconds, not the default 10, so the takeover tests are quick.
LEASE_SECONDS = 3.0


@dataclass
class ClusterApp(AppServer):
    """One `python -m webapp` on 127.0.0.1 whose ``db`` is the shared ``postgresql://`` URL."""

    name: str = "app"

    def command(self) -> list[str]:
        return [*super().command(), "--host", "127.0.0.1", "--lease-seconds", str(LEASE_SECONDS)]

    @property
    def address(self) -> str:
        """What nginx's ``$upstream_addr`` says for this process."""
        return f"127.0.0.1:{self.port}"


def failed(request: pytest.FixtureRequest) -> bool:
    """Whether the requesting test failed so far (setup or call)."""
    reports = request.node.stash.get(PHASE_REPORTS, {})
    return any(r.failed for r in reports.values())


def stop_all(servers: Sequence[AppServer], grace: float = STOP_TIMEOUT) -> None:
    """SIGTERM to every live process at once, SIGKILL to any still alive after ``grace``."""
    live = [s.proc for s in servers if s.proc is not None and s.proc.poll() is None]
    for proc in live:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in live:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)


Pair = tuple[ClusterApp, ClusterApp]
OFFLINE_DELAY = 0.01  # seconds between the offline model's chunks: "count to 100" ~ 1 s


class Apps:
    """Starts app processes on one database; `close` ends them all."""

    def __init__(self, dsn: str, folder: Path) -> None:
        self.dsn = dsn
        self.folder = folder
        self.started: list[ClusterApp] = []
        self.nginxes: list[Nginx] = []
        atexit.register(self.close)  # should pytest itself be interrupted mid-teardown

    def start(self, name: str, *, offline_delay: float = OFFLINE_DELAY) -> ClusterApp:
        server = ClusterApp(
            port=free_port(),
            db=self.dsn,  # type: ignore[arg-type]  # a postgresql:// URL, passed as is
            log_path=self.folder / f"server-{name}.log",
            offline_delay=offline_delay,
            name=name,
        )
        self.started.append(server)  # before start(): a half-started process is ended too
        server.start()
        return server

    def pair(self) -> Pair:
        return self.start("A"), self.start("B")

    def nginx(self, servers: list[ClusterApp]) -> Nginx:
        proxy = Nginx(self.folder / f"nginx-{len(self.nginxes)}", [s.address for s in servers])
        self.nginxes.append(proxy)
        proxy.start()
        return proxy

    def close(self) -> None:
        atexit.unregister(self.close)
        try:
            stop_all(self.started)
        finally:
            for proxy in self.nginxes:
                proxy.stop()

    def logs(self) -> str:
        parts = [f"----- {s.name} ({s.log_path}) -----\n{s.log()}" for s in self.started]
        parts += [proxy.log() for proxy in self.nginxes]
        return "\n".join(parts)


# --- nginx ----------------------------------------------------------------------------


def missing_nginx(reason: str) -> NoReturn:
    """Skip a test that needs nginx -- or, under CI=true, fail it: CI skips nothing."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}. CI=true: the nginx tests must run, not be skipped.")
    pytest.skip(reason)


def find_nginx() -> str:
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    if found is None:
        missing_nginx("nginx is not installed (`apt-get install -y nginx`)")
    return found


NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 1;
{user}pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 512; }}
http {{
    log_format upstream '$request_method $uri $status upstream=$upstream_addr';
    access_log {root}/access.log upstream;
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    upstream webapp {{
{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 12m;
        location / {{
            proxy_pass http://webapp;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # $http_host, not $host: the browser's Origin carries the port, and the app
            # refuses a POST whose Origin is not the Host it was sent to.
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_cache off;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
            proxy_next_upstream error timeout http_502 http_503;
            add_header X-Upstream $upstream_addr always;
        }}
    }}
}}
"""


@dataclass
class Nginx:
    """A private nginx on a free port of 127.0.0.1, round-robin over ``upstreams``."""

    root: Path
    upstreams: list[str]
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    binary: str = field(default_factory=find_nginx)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):  # another process may take the free port first
            self.port = free_port()
            self._write_config()
            command = [self.binary, "-e", str(self.root / "error.log")]
            command += ["-c", str(self.root / "nginx.conf"), "-p", str(self.root) + "/"]
            self.proc = subprocess.Popen(
                command,
                stdout=subprocess.DEVNULL,
                stderr=(self.root / "stderr.log").open("ab"),
            )
            if self._wait_until_ready():
                return
            self.stop()
        raise RuntimeError(f"nginx did not start:\n{self.log()}")

    def _write_config(self) -> None:
        # Run as root (CI does), nginx's workers would run as "nobody" and could not use
        # the temp dirs under pytest's private tmp folder.
        user = "user root;\n" if os.geteuid() == 0 else ""
        servers = "\n".join(f"        server {u};" for u in self.upstreams)
        text = NGINX_CONF.format(user=user, root=self.root, servers=servers, port=self.port)
        (self.root / "nginx.conf").write_text(text)

    def _wait_until_ready(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                httpx.get(self.base_url + "/", timeout=2.0)
                return True
            except httpx.TransportError:
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        """SIGQUIT (graceful: nginx ends its workers), SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        workers = _children(self.proc.pid)
        self.proc.send_signal(signal.SIGQUIT)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            for pid in workers:  # they would outlive a killed master and keep the port
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait(timeout=5)

    def upstreams_used(self) -> set[str]:
        path = self.root / "access.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return set(re.findall(r"upstream=([\d.]+:\d+)", text))

    def log(self) -> str:
        parts = []
        for name in ("stderr.log", "error.log", "access.log"):
            path = self.root / name
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-60:]
                parts.append(f"--- nginx {name} ---\n" + "\n".join(lines))
        return "\n".join(parts) or "(no nginx log)"


def _children(pid: int) -> list[int]:
    """The ids of ``pid``'s child processes (nginx's workers), from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


# --- reading the app over HTTP ---------------------------------------------------------


def client(base_url: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, timeout=HTTP_TIMEOUT)


def new_chat(http: httpx.Client) -> str:
    response = http.post("/chats")
    assert response.status_code == 303, response.text
    return str(response.headers["location"]).rsplit("/", 1)[1]


def chat_page(http: httpx.Client, chat_id: str) -> Node:
    response = http.get(f"/chats/{chat_id}")
    assert response.status_code == 200, response.text
    return parse_html(response.text)


def shown_replies(page: Node) -> list[Node]:
    return page.find_all(data_role="assistant")


def shown_text(reply: Node) -> str:
    return " ".join(reply.find(class_="content").text().split())


@dataclass(frozen=True)
class LiveRun:
    """The run a chat page shows streaming: where its stream is and the page's position."""

    stream_path: str
    epoch: str
    seq: int


def live_run(page: Node) -> LiveRun | None:
    """The streaming reply's ``sse-connect`` URL, split into path and position."""
    for reply in shown_replies(page):
        url = reply.attrs.get("sse-connect")
        if url:
            path, _, after = url.partition("?after=")
            epoch, _, seq = unquote(after).rpartition(":")
            return LiveRun(path, epoch, int(seq))
    return None


@dataclass(frozen=True)
class Arrival:
    at: float  # time.monotonic() when the event's last byte was read
    event: SSEvent

    @property
    def position(self) -> tuple[str, int]:
        epoch, _, seq = (self.event.id or "").rpartition(":")
        return epoch, int(seq) if seq.isdigit() else -1


def read_stream(
    base_url: str,
    path: str,
    last_event_id: str | None,
    *,
    limit: int | None = None,
    timeout: float = STREAM_TIMEOUT,
) -> tuple[int, list[Arrival]]:
    """(status, events) of one SSE connection, read to its end, to ``done``, or to
    ``limit`` events (then the connection is dropped, like a closed tab)."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    arrivals: list[Arrival] = []
    deadline = time.monotonic() + timeout
    buffer = ""
    stream_timeout = httpx.Timeout(HTTP_TIMEOUT, read=20.0)
    with httpx.stream("GET", base_url + path, headers=headers, timeout=stream_timeout) as response:
        if response.status_code != 200:
            return response.status_code, arrivals
        for chunk in response.iter_text():
            buffer += chunk.replace("\r\n", "\n")
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                now = time.monotonic()
                arrivals.extend(Arrival(now, e) for e in parse_sse(block + "\n\n"))
                if arrivals and arrivals[-1].event.event == "done":
                    return 200, arrivals
                if limit is not None and len(arrivals) >= limit:
                    return 200, arrivals
            if time.monotonic() > deadline:
                raise AssertionError(f"{path}: no done event within {timeout} s")
    return response.status_code, arrivals


def fragments_text(arrivals: Sequence[Arrival], name: str = "text") -> str:
    return "".join(parse_html(a.event.data).text() for a in arrivals if a.event.event == name)


T = TypeVar("T")


class Background(threading.Thread, Generic[T]):
    """A call on a thread of its own; `result()` joins it (bounded) and re-raises its error."""

    def __init__(self, target: Callable[[], T]) -> None:
        super().__init__(daemon=True)
        self._target_call = target
        self._value: T | None = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._value = self._target_call()
        except BaseException as exc:  # noqa: BLE001  # handed to the test in result()
            self._error = exc

    def result(self, timeout: float = STREAM_TIMEOUT) -> T:
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"a background call did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set when no error was raised
