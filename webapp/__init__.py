"""Chat with durable runs: an agent runtime plus a server-rendered chat UI.

Layers, lowest first: transcript -> stores -> runtime -> models -> web.
"""

from webapp.errors import GuardrailTripped, UserError
from webapp.runtime.agent import Agent, RunHooks
from webapp.runtime.approvals import record_decisions
from webapp.runtime.context_policy import ContextPolicy, FileResultStore
from webapp.runtime.options import CheckpointOptions
from webapp.runtime.result import RunResult
from webapp.runtime.runner import Runner
from webapp.runtime.tool import RunContext, tool
from webapp.stores.checkpoint import Checkpointer, InMemoryCheckpointer, RunHead, RunSnapshot
from webapp.stores.session import InMemorySession, Segment, Session
from webapp.usage import Usage

__all__ = [
    "Agent",
    "CheckpointOptions",
    "Checkpointer",
    "ContextPolicy",
    "FileResultStore",
    "GuardrailTripped",
    "InMemoryCheckpointer",
    "InMemorySession",
    "PostgresCheckpointer",
    "PostgresSession",
    "RunContext",
    "RunHead",
    "RunHooks",
    "RunResult",
    "RunSnapshot",
    "Runner",
    "SQLiteCheckpointer",
    "SQLiteSession",
    "Segment",
    "Session",
    "Usage",
    "UserError",
    "record_decisions",
    "tool",
]


def __getattr__(name: str) -> object:
    # The SQLite and PostgreSQL stores import their drivers; webapp.stores loads
    # them on first use only.
    if name in ("SQLiteSession", "SQLiteCheckpointer", "PostgresSession", "PostgresCheckpointer"):
        from webapp import stores

        return getattr(stores, name)
    raise AttributeError(f"module 'webapp' has no attribute {name!r}")
