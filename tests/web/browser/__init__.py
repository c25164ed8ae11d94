"""Browser tests: Playwright driving Debian's Chromium against a real uvicorn server.

This folder is a package on purpose: the browser fixture is package-scoped, so
pytest closes Playwright when it leaves this folder. Playwright's sync API marks
its event loop as running in the main thread for as long as it is alive, which
would make every later pytest-asyncio test fail with "Runner.run() cannot be
called from a running event loop".
"""
