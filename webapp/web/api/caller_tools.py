"""The tools an API request brings (SPEC §16): offered to the model, run by nobody here.

Each becomes a runtime `Tool` that asks first (``approval="ask"``), so a call
of one pauses the run exactly where the browser's run waits for Allow or Deny
(`webapp.runtime.approvals`). The API then hands the waiting calls to the
caller as OpenAI tool calls and ends the run (`webapp.web.api.service`); the
caller's next request brings the results. The function is never called: a
pause comes first, always.
"""

from __future__ import annotations

import json
from typing import Any

from webapp.runtime.tool import Tool


def _never(**arguments: Any) -> str:
    raise RuntimeError("a caller's tool is run by the caller, never by this server")


def caller_tools(specs_json: str) -> list[Tool]:
    specs = json.loads(specs_json or "[]")
    return [
        Tool(
            s["name"],
            s["description"],
            s["parameters"],
            _never,
            approval="ask",
            rerunnable=False,
        )
        for s in specs
    ]
