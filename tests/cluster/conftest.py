"""Fixtures: app processes sharing one throwaway PostgreSQL, nginx in front, Chromium pages.

Every process is started through a fixture that ends it at teardown, even
when the test fails or a start fails half-way; on a failing test the
processes' logs (and nginx's, and the pages' console errors) are printed in
the teardown section of the report.
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
from postgres import Cluster

from .machinery import PHASE_REPORTS, Apps, Pair, failed, ui

EXPECT_TIMEOUT_MS = 10_000
ACTION_TIMEOUT_MS = 10_000
NAVIGATION_TIMEOUT_MS = 20_000


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    item.stash.setdefault(PHASE_REPORTS, {})[report.when] = report
    return report


@pytest.fixture
def apps(postgres_dsn: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Apps]:
    """Processes of this test alone, on an empty schema of its own."""
    found = Apps(postgres_dsn, tmp_path)
    try:
        yield found
    finally:
        found.close()
        if failed(request):
            print(found.logs())


@pytest.fixture(scope="module")
def module_apps(
    postgres_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Apps]:
    """Processes shared by one test module (a start costs 1-2 s); tests use chats of their own."""
    found = Apps(postgres_cluster.new_dsn(), tmp_path_factory.mktemp("cluster"))
    try:
        yield found
    finally:
        found.close()


@pytest.fixture(scope="module")
def shared_pair(module_apps: Apps) -> Pair:
    return module_apps.pair()


@pytest.fixture
def pair(shared_pair: Pair, module_apps: Apps, request: pytest.FixtureRequest) -> Iterator[Pair]:
    """Processes A and B on one database, shared by the module."""
    yield shared_pair
    if failed(request):
        print(module_apps.logs())


# --- Chromium --------------------------------------------------------------------------


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """One Chromium for this folder; package-scoped so Playwright's loop ends with it
    (see tests/web/browser/__init__.py)."""
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=ui.CHROMIUM, args=ui.CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def open_page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Callable[[str], Page]]:
    """open_page(base_url) -> a page in a fresh browser context on that address."""
    contexts: list[BrowserContext] = []
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            problems.append(f"console {message.type}: {message.text}")

    def open_(base_url: str) -> Page:
        context = browser.new_context(base_url=base_url)
        contexts.append(context)
        context.set_default_timeout(ACTION_TIMEOUT_MS)
        context.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)
        context.add_init_script(ui.RECORDER_JS)
        page = context.new_page()
        page.on("console", on_console)
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        return page

    yield open_
    for context in contexts:
        context.close()
    if failed(request) and problems:
        print("----- browser console -----\n" + "\n".join(problems[-100:]))
