"""What ``GET /metrics`` tells an operator (SPEC §17), through `prometheus-client`.

One `Metrics` per app, on a registry of its own (two apps in one process, as in
the tests, never share a counter). It is the runs' observer
(`webapp.web.live.run_end.RunObserver`): `RunManager` tells it as runs start
and end; the request middleware (`webapp.web.operations`) as requests end and
event streams open and close; a task of the lifespan samples the event loop's
lag. What is a state rather than an event -- the runs this process runs now,
the runs waiting for an approval -- is read when the metrics are asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from webapp.usage import Usage

logger = logging.getLogger("webapp.web.metrics")

__all__ = ["CONTENT_TYPE", "Metrics"]

LAG_INTERVAL = 0.5  # seconds between the event loop's lag samples
_DURATIONS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LAGS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """The app's counters, gauges and histograms, and the text ``/metrics`` answers."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.runs_started = Counter(
            "webapp_runs_started", "Runs started (or resumed) by this process", registry=registry
        )
        self.runs_ended = Counter(
            "webapp_runs_ended",
            "Runs this process ended, by outcome",
            ["outcome"],
            registry=registry,
        )
        self.runs_running = Gauge(
            "webapp_runs_running", "Runs this process runs now", registry=registry
        )
        self.runs_waiting = Gauge(
            "webapp_runs_waiting",
            "Runs waiting for a tool approval (every process)",
            registry=registry,
        )
        self.tokens = Counter(
            "webapp_tokens",
            "Tokens the endpoints reported for the runs this process completed",
            ["direction"],
            registry=registry,
        )
        self.sse_clients = Gauge("webapp_sse_clients", "Event streams open now", registry=registry)
        self.request_seconds = Histogram(
            "webapp_request_duration_seconds",
            "Time to answer a request (an event stream: while it was open), by route",
            ["method", "route", "status"],
            buckets=_DURATIONS,
            registry=registry,
        )
        self.loop_lag = Histogram(
            "webapp_event_loop_lag_seconds",
            f"How late the event loop woke a task that slept {LAG_INTERVAL} s",
            buckets=_LAGS,
            registry=registry,
        )
        self.database_errors = Counter(
            "webapp_database_errors", "Database errors the app met", registry=registry
        )
        for outcome in ("completed", "failed", "stopped", "waiting"):
            self.runs_ended.labels(outcome)  # present at 0 from the start
        for direction in ("in", "out"):
            self.tokens.labels(direction)

    # --- the runs' observer -------------------------------------------------------------

    def run_started(self) -> None:
        self.runs_started.inc()

    def run_ended(self, status: str, usage: Usage | None) -> None:
        self.runs_ended.labels(status).inc()
        if usage is not None:
            self.tokens.labels("in").inc(usage.input_tokens)
            self.tokens.labels("out").inc(usage.output_tokens)

    def database_error(self) -> None:
        self.database_errors.inc()

    # --- requests -------------------------------------------------------------------------

    def request_done(self, method: str, route: str, status: int, seconds: float) -> None:
        self.request_seconds.labels(method, route, str(status)).observe(seconds)

    # --- the answer -------------------------------------------------------------------------

    async def text(self, running: int, waiting: Callable[[], Awaitable[int]]) -> bytes:
        """The Prometheus text, the states read now (the waiting runs from the database)."""
        self.runs_running.set(running)
        try:
            self.runs_waiting.set(await waiting())
        except Exception:  # the database is down: say so, and still answer the rest
            logger.exception("metrics: could not count the runs waiting for an approval")
            self.database_error()
        return generate_latest(self.registry)

    @contextlib.asynccontextmanager
    async def sampling_loop_lag(self) -> AsyncIterator[None]:
        """Sample the event loop's lag while the block runs (the app's lifespan)."""
        task = asyncio.get_running_loop().create_task(self._sample(), name="webapp-loop-lag")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(LAG_INTERVAL)
            self.loop_lag.observe(max(0.0, loop.time() - asked - LAG_INTERVAL))
