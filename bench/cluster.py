"""Several app processes on one PostgreSQL database (SPEC §9): follow delay and sends per second.

Run from the repository root: ``python bench/cluster.py`` (about a minute and
a half). It starts a throwaway PostgreSQL server (tests/postgres.py's
`Cluster`, Debian's binaries), or uses the database of a ``postgresql://``
URL given as the first argument (each scenario then gets a schema of its own,
dropped at the end). The app runs as real ``python -m webapp`` processes with
the offline model. Printed, never asserted:

1. SSE delay across processes: two processes A and B; runs start on A with a
   paced offline model (``--delay``), and the same run's event stream is read
   from A and from B at once, both from the start of its log. For every record
   of the log, the delay is (when the first event carrying it arrived from B)
   minus (the same from A); the backlog both streams get on connecting is left
   out. p50, p95 and max over all records of all runs.
2. Sends per second with 1, 2 and 4 processes (``--offline-delay 0``): many
   chats at once, each sending a message and following the reply's event
   stream to its ``done`` event, then sending again. Every request goes to the
   next process in turn (round-robin, as nginx does), so a stream is often
   read from a process that does not run the reply. Sends/s: replies finished
   within a measured window after a warm-up; the p50/p95 of one send-to-done;
   the CPUs' worth the app processes and this client used meanwhile (the
   client shares the machine: on few cores it and PostgreSQL cap the figure).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self
from urllib.parse import unquote

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from postgres import Cluster, free_port  # tests/postgres.py

HX = {"HX-Request": "true"}
TICK = os.sysconf("SC_CLK_TCK")
_SSE_CONNECT = re.compile(r'sse-connect="([^"]+)"')


# --- processes ------------------------------------------------------------------------


@dataclass
class App:
    """One ``python -m webapp`` process on the shared database."""

    dsn: str
    log: Path
    offline_delay: float
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "webapp", "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--db", self.dsn, "--offline-delay", str(self.offline_delay)]
        command += ["--log-level", "warning"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "WEBAPP_"))}
        env["PYTHONPATH"] = str(ROOT)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"the app exited:\n{self.log.read_text()[-3000:]}")
            try:
                httpx.get(self.base + "/", timeout=1.0)
                return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"the app did not answer within {timeout} s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@contextlib.contextmanager
def running(dsn: str, count: int, offline_delay: float, logs: Path) -> Iterator[list[App]]:
    apps = [App(dsn, logs / f"app-{uuid.uuid4().hex[:6]}.log", offline_delay) for _ in range(count)]
    try:
        for app in apps:
            app.start()
        for app in apps:
            app.wait_ready()
        yield apps
    finally:
        for app in apps:
            if app.proc is not None and app.proc.poll() is None:
                app.proc.send_signal(signal.SIGTERM)
        for app in apps:
            app.stop()


class Schemas:
    """A fresh schema per scenario, on the throwaway cluster or the given database."""

    def __init__(self, dsn: str | None) -> None:
        self.given = dsn
        self.cluster: Cluster | None = None
        self.made: list[str] = []

    async def __aenter__(self) -> Self:
        if self.given is None:
            self.cluster = Cluster().start()  # max_connections=300: 4 processes fit
        return self

    async def new(self) -> str:
        if self.cluster is not None:
            return self.cluster.new_dsn()
        assert self.given is not None
        name = f"bench_{uuid.uuid4().hex[:10]}"
        await _execute(self.given, f"CREATE SCHEMA {name}")
        self.made.append(name)
        return f"{self.given}{'&' if '?' in self.given else '?'}search_path={name}"

    async def __aexit__(self, *exc: object) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        for name in self.made:
            await _execute(str(self.given), f"DROP SCHEMA {name} CASCADE")


async def _execute(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


# --- the app over HTTP ----------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    name: str
    seq: int  # the last log record it carries
    at: float  # time.monotonic() when it was read


async def new_chat(http: httpx.AsyncClient, base: str) -> str:
    response = await http.post(base + "/chats")
    if response.status_code != 303:
        raise RuntimeError(f"new chat: {response.status_code} {response.text[:300]}")
    return str(response.headers["location"]).rsplit("/", 1)[1]


def stream_of(html: str) -> tuple[str, str] | None:
    """(path, "EPOCH:SEQ") of the streaming reply a page or fragment shows, if any."""
    found = _SSE_CONNECT.search(html)
    if found is None:
        return None
    path, _, after = found.group(1).replace("&amp;", "&").partition("?after=")
    return path, unquote(after)


async def read_events(
    http: httpx.AsyncClient, url: str, position: str, timeout: float = 120.0
) -> list[Event]:
    """One event stream from ``position`` to its ``done`` event (or its end)."""
    events: list[Event] = []
    buffer = ""
    async with asyncio.timeout(timeout):
        async with http.stream("GET", url, headers={"Last-Event-ID": position}) as response:
            if response.status_code == 204:
                return events
            if response.status_code != 200:
                raise RuntimeError(f"{url}: {response.status_code}")
            async for chunk in response.aiter_text():
                buffer += chunk.replace("\r\n", "\n")
                while "\n\n" in buffer:
                    block, buffer = buffer.split("\n\n", 1)
                    name = ident = ""
                    for line in block.split("\n"):
                        key, _, value = line.partition(": ")
                        if key == "event":
                            name = value
                        elif key == "id":
                            ident = value
                    if not ident:
                        continue  # a ping
                    events.append(Event(name, int(ident.rpartition(":")[2]), time.monotonic()))
                    if name in ("done", "reset"):
                        return events
    return events


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# --- 1. the delay of a follower ------------------------------------------------------


def first_arrival(events: Sequence[Event]) -> Callable[[int], float]:
    """seq -> when the first event carrying that record arrived."""

    def at(seq: int) -> float:
        return next(e.at for e in events if e.seq >= seq)

    return at


async def follow_one(http: httpx.AsyncClient, a: App, b: App, count: int) -> list[float]:
    chat_id = await new_chat(http, a.base)
    sent = await http.post(
        f"{a.base}/chats/{chat_id}/messages", data={"text": f"count to {count}"}, headers=HX
    )
    found = stream_of(sent.text)
    if found is None:
        raise RuntimeError(f"the send showed no streaming reply: {sent.status_code}")
    path, position = found
    start = position.rpartition(":")[0] + ":0"
    on_a, on_b = await asyncio.gather(
        read_events(http, a.base + path, start), read_events(http, b.base + path, start)
    )
    if not on_a or not on_b or on_a[-1].seq != on_b[-1].seq:
        raise RuntimeError("the two streams did not end at the same record")
    backlog = max(on_a[0].seq, on_b[0].seq)  # sent at once on connecting: no follow delay
    from_a, from_b = first_arrival(on_a), first_arrival(on_b)
    return [from_b(s) - from_a(s) for s in range(backlog + 1, on_a[-1].seq + 1)]


async def follow_delay(dsn: str, logs: Path, delay: float, runs: int, at_once: int) -> None:
    count = 200
    with running(dsn, 2, delay, logs) as (a, b):
        limits = httpx.Limits(max_connections=4 * at_once + 8)
        async with httpx.AsyncClient(timeout=30, limits=limits) as http:
            await follow_one(http, a, b, 5)  # warm both processes up
            delays: list[float] = []
            for first in range(0, runs, at_once):
                batch = [follow_one(http, a, b, count) for _ in range(min(at_once, runs - first))]
                for found in await asyncio.gather(*batch):
                    delays.extend(found)
    ms = [d * 1000 for d in delays]
    print(
        f"1. SSE delay, B (follower) minus A (owner), {runs} runs of {count} chunks "
        f"{delay * 1000:.0f} ms apart, {at_once} at a time, {len(ms)} records:\n"
        f"   p50 {percentile(ms, 0.5):.1f} ms   p95 {percentile(ms, 0.95):.1f} ms   "
        f"max {max(ms):.1f} ms   (mean {statistics.fmean(ms):.1f} ms)"
    )


# --- 2. sends per second ----------------------------------------------------------------


@dataclass
class Tally:
    """Sends whose reply finished within [measuring_from, measuring_until]."""

    measuring_from: float
    measuring_until: float
    done: int = 0
    refused: int = 0
    took: list[float] = field(default_factory=list)
    server_cpu: float = 0.0  # seconds of CPU the app processes used in the window
    client_cpu: float = 0.0  # the same for this benchmark's own process


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def sample_cpu(apps: list[App], tally: Tally) -> None:
    """CPU used by the app processes and by this client during the measured window."""
    pids = [app.proc.pid for app in apps if app.proc is not None]
    await asyncio.sleep(max(0.0, tally.measuring_from - time.monotonic()))
    server, client = sum(map(cpu_seconds, pids)), time.process_time()
    await asyncio.sleep(max(0.0, tally.measuring_until - time.monotonic()))
    tally.server_cpu = sum(map(cpu_seconds, pids)) - server
    tally.client_cpu = time.process_time() - client


async def chat_worker(
    http: httpx.AsyncClient, bases: Callable[[], str], tally: Tally, message: str
) -> None:
    chat_id = await new_chat(http, bases())
    while time.monotonic() < tally.measuring_until:
        started = time.monotonic()
        sent = await http.post(
            f"{bases()}/chats/{chat_id}/messages", data={"text": message}, headers=HX
        )
        if sent.status_code == 409:  # the previous reply's bookkeeping is not over yet
            tally.refused += 1
            await asyncio.sleep(0.01)
            continue
        if sent.status_code != 200:
            raise RuntimeError(f"send: {sent.status_code} {sent.text[:300]}")
        await follow_to_done(http, bases, chat_id, sent.text)
        ended = time.monotonic()
        if tally.measuring_from <= ended <= tally.measuring_until:
            tally.done += 1
            tally.took.append(ended - started)


async def follow_to_done(
    http: httpx.AsyncClient, bases: Callable[[], str], chat_id: str, html: str
) -> None:
    """Read the reply's stream until its done event, as a page would."""
    found = stream_of(html)
    while found is not None:  # None: it had finished before the page was rendered
        path, position = found
        events = await read_events(http, bases() + path, position)
        if events and events[-1].name == "done":
            return
        page = await http.get(f"{bases()}/chats/{chat_id}")  # a reset, or the stream ended
        found = stream_of(page.text)


async def throughput(
    dsn: str, logs: Path, processes: int, chats: int, warmup: float, seconds: float
) -> tuple[float, Tally]:
    with running(dsn, processes, 0.0, logs) as apps:
        turn = itertools.cycle([app.base for app in apps])
        limits = httpx.Limits(max_connections=2 * chats + 8, max_keepalive_connections=2 * chats)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            now = time.monotonic()
            tally = Tally(now + warmup, now + warmup + seconds)
            workers = [
                chat_worker(http, lambda: next(turn), tally, "count to 20") for _ in range(chats)
            ]
            await asyncio.gather(sample_cpu(apps, tally), *workers)
    return tally.done / seconds, tally


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with Schemas(args.dsn) as schemas:
            await measure(args, schemas, Path(tmp))


async def measure(args: argparse.Namespace, schemas: Schemas, logs: Path) -> None:
    try:
        await follow_delay(await schemas.new(), logs, args.delay, args.runs, args.at_once)
        print(
            f"2. sends per second, offline model with no delay ({args.chats} chats at once, "
            f"each 'count to 20' then follow its stream to done; {args.warmup:.0f} s warm-up, "
            f"{args.seconds:.0f} s measured, {os.cpu_count()} CPUs shared with PostgreSQL "
            "and this client):"
        )
        for processes in args.processes:
            rate, tally = await throughput(
                await schemas.new(), logs, processes, args.chats, args.warmup, args.seconds
            )
            took = [t * 1000 for t in tally.took] or [0.0]
            print(
                f"   {processes} process{'es' if processes > 1 else '  '}: "
                f"{rate:7.1f} sends/s   send-to-done p50 {percentile(took, 0.5):6.0f} ms  "
                f"p95 {percentile(took, 0.95):6.0f} ms   CPU: app processes "
                f"{tally.server_cpu / args.seconds:.2f}, client {tally.client_cpu / args.seconds:.2f}"
                f"   ({tally.refused} sends refused 409)"
            )
    except Exception:
        for log in sorted(logs.glob("app-*.log")):
            print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}")
        raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dsn", nargs="?", help="postgresql:// URL (default: a throwaway server)")
    parser.add_argument("--delay", type=float, default=0.02, help="1: seconds between chunks")
    parser.add_argument("--runs", type=int, default=12, help="1: runs followed")
    parser.add_argument("--at-once", type=int, default=4, help="1: runs followed at a time")
    parser.add_argument("--chats", type=int, default=32, help="2: chats sending at once")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--warmup", type=float, default=3.0, help="2: seconds not measured")
    parser.add_argument("--seconds", type=float, default=10.0, help="2: seconds measured")
    args = parser.parse_args()
    if args.dsn is not None and not args.dsn.startswith(("postgresql://", "postgres://")):
        parser.error(f"expected a postgresql:// URL, got {args.dsn!r}")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
