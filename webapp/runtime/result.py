"""What a finished run returns: `RunResult`, and a paused run's `PendingApproval` calls.

Both are defined beside `Agent` (`webapp.runtime.agent`), whose hooks receive a
result and which a result names; this is the module to import them from.
"""

from __future__ import annotations

from webapp.runtime.agent import PendingApproval, RunResult

__all__ = ["PendingApproval", "RunResult"]
