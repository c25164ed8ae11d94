"""Stores: the Session log (what a conversation said) and run Checkpoints (how far a run got).

`webapp.stores.sqlite.SQLiteStore` is the shared SQLite machinery (one
connection, serialized jobs, group commit) behind `SQLiteSession`,
`SQLiteCheckpointer` and the web app's own tables; opening its file (retries,
pragmas, schema versions) lives in `webapp.stores.sqlite_connection`.
`webapp.stores.postgres.PostgresStore` is the same role on PostgreSQL (an
asyncpg pool) behind `PostgresSession` and `PostgresCheckpointer`. Both back
ends store the same JSON text, encoded and decoded by `webapp.stores.codec`.
"""

from __future__ import annotations

from webapp.stores.checkpoint import (
    Checkpointer,
    InMemoryCheckpointer,
    RunHead,
    RunSnapshot,
)
from webapp.stores.session import InMemorySession, Segment, Session

__all__ = [
    "Checkpointer",
    "InMemoryCheckpointer",
    "InMemorySession",
    "PostgresCheckpointer",
    "PostgresSession",
    "PostgresStore",
    "RunHead",
    "RunSnapshot",
    "SQLiteCheckpointer",
    "SQLiteSession",
    "SQLiteStore",
    "Segment",
    "Session",
]

_LAZY = {
    "SQLiteSession": "webapp.stores.sqlite_session",
    "SQLiteCheckpointer": "webapp.stores.sqlite_checkpoint",
    "SQLiteStore": "webapp.stores.sqlite",
    "PostgresSession": "webapp.stores.postgres_session",
    "PostgresCheckpointer": "webapp.stores.postgres_checkpoint",
    "PostgresStore": "webapp.stores.postgres",
}


def __getattr__(name: str) -> object:
    # The SQLite and PostgreSQL stores import their drivers: load them on first
    # use only, so the in-memory stores and the runtime import without them.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'webapp.stores' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
