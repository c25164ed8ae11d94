"""Fixtures: one Chromium per test package, one context per test, a real app subprocess.

On a failing test the server's log and the page's console errors are printed in the
teardown section of the report, which is where one looks first.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Page,
    expect,
    sync_playwright,
)

from .harness import (
    AppFactory,
    AppServer,
    EndpointApp,
    FakeEndpoint,
    free_port,
    tools_args,
    write_tools_config,
)
from .ui import CHROMIUM, CHROMIUM_ARGS, RECORDER_JS

EXPECT_TIMEOUT_MS = 10_000
ACTION_TIMEOUT_MS = 10_000
NAVIGATION_TIMEOUT_MS = 20_000

_phase_reports = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    item.stash.setdefault(_phase_reports, {})[report.when] = report
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    reports = request.node.stash.get(_phase_reports, {})
    return any(r.failed for r in reports.values())


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def start_app(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[AppFactory]:
    """Start `python -m webapp` on a free port and tmp_path/chat.db; stopped at teardown."""
    started: list[AppServer] = []

    def start(*extra_args: str, offline_delay: float = 0.01) -> AppServer:
        server = AppServer(
            port=free_port(),
            db=tmp_path / "chat.db",
            log_path=tmp_path / f"server-{len(started)}.log",
            offline_delay=offline_delay,
            extra_args=list(extra_args),
        )
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.stop()
    if _failed(request):
        for server in started:
            print(f"----- server log ({server.log_path}) -----\n{server.log()}")


@pytest.fixture(scope="module")
def shared_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """One offline app per test module: starting a server per test costs ~1-2 s each.

    Tests sharing it stay independent by working in a chat of their own (New chat);
    a test that needs a clean chat list, a kill or other flags uses `start_app`.
    """
    directory = tmp_path_factory.mktemp("shared-app")
    server = AppServer(
        port=free_port(), db=directory / "chat.db", log_path=directory / "server.log"
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def app(shared_app: AppServer, request: pytest.FixtureRequest) -> Iterator[AppServer]:
    """The app with the offline model and a 10 ms delay between chunks."""
    yield shared_app
    if _failed(request):
        print(f"----- server log ({shared_app.log_path}) -----\n{shared_app.log()}")


def _new_context(browser: Browser, base_url: str, **options: object) -> BrowserContext:
    context = browser.new_context(base_url=base_url, **options)  # type: ignore[arg-type]
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    context.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)
    context.add_init_script(RECORDER_JS)
    return context


@pytest.fixture
def open_page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Callable[..., Page]]:
    """open_page(server, **context_options) -> a page in a fresh context on that server."""
    contexts: list[BrowserContext] = []
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            problems.append(f"console {message.type}: {message.text}")

    def open_(server: AppServer, **options: object) -> Page:
        context = _new_context(browser, server.base_url, **options)
        contexts.append(context)
        page = context.new_page()
        page.on("console", on_console)
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        return page

    yield open_
    for context in contexts:
        context.close()
    if _failed(request) and problems:
        print("----- browser console -----\n" + "\n".join(problems[-100:]))


@pytest.fixture
def page(app: AppServer, open_page: Callable[..., Page]) -> Page:
    return open_page(app)


@pytest.fixture(scope="module")
def shared_numbered_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EndpointApp]:
    """One app per test module against a "numbered" fake endpoint (see `shared_app`).

    Its requests accumulate over the module: a test counts from len(endpoint.requests).
    """
    endpoint = FakeEndpoint(mode="numbered")
    endpoint.start()
    directory = tmp_path_factory.mktemp("numbered-app")
    server = AppServer(
        port=free_port(),
        db=directory / "chat.db",
        log_path=directory / "server.log",
        extra_args=["--base-url", endpoint.base_url, "--model", "test"],
    )
    try:
        server.start()
        yield EndpointApp(server, endpoint)
    finally:
        server.stop()
        endpoint.stop()


@pytest.fixture
def numbered_app(
    shared_numbered_app: EndpointApp, request: pytest.FixtureRequest
) -> Iterator[EndpointApp]:
    yield shared_numbered_app
    if _failed(request):
        server = shared_numbered_app.server
        print(f"----- server log ({server.log_path}) -----\n{server.log()}")


@pytest.fixture(scope="module")
def shared_tools_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """One app per test module with MCP servers (`write_tools_config`, a broken one too)
    and a "tools" fake endpoint; the servers' traces are in the app's db folder."""
    endpoint = FakeEndpoint(mode="tools")
    endpoint.start()
    directory = tmp_path_factory.mktemp("tools-app")
    server = AppServer(
        port=free_port(),
        db=directory / "chat.db",
        log_path=directory / "server.log",
        extra_args=tools_args(endpoint, write_tools_config(directory, broken=True)),
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()
        endpoint.stop()


@pytest.fixture
def tools_app(shared_tools_app: AppServer, request: pytest.FixtureRequest) -> Iterator[AppServer]:
    yield shared_tools_app
    if _failed(request):
        print(f"----- server log ({shared_tools_app.log_path}) -----\n{shared_tools_app.log()}")


@pytest.fixture
def fake_endpoint() -> Iterator[Callable[[str], FakeEndpoint]]:
    """fake_endpoint(mode) -> a started OpenAI-compatible endpoint on loopback."""
    endpoints: list[FakeEndpoint] = []

    def start(mode: str) -> FakeEndpoint:
        endpoint = FakeEndpoint(mode=mode)
        endpoints.append(endpoint)
        endpoint.start()
        return endpoint

    yield start
    for endpoint in endpoints:
        endpoint.stop()
