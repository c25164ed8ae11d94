"""Several app processes on one PostgreSQL database (SPEC §9), as real processes on loopback.

A package, like tests/web/browser, so that its package-scoped Chromium (and
Playwright's event loop) ends when pytest leaves this folder.
"""
