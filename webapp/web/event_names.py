"""The SSE event names: the run log writes them and the templates listen for them.

A run's log records are named by what changed (`webapp.web.live.run_state`:
text, reasoning, a tool card, the end), and each record goes out as the SSE
event of that name; ``reset`` is the stream's own. Templates reach them as
``events.TEXT`` and so on (a global of the template environment), and a test
fails if any template names an event this module does not, so the two cannot
drift apart.
"""

from __future__ import annotations

# TEXT: escaped text appended to the reply's .content; REASONING: to its reasoning
# block; TOOL: a new tool card, or (out of band) a finished one replacing its card;
# DONE: the final reply, swapped over the streaming one (the stream ends).
from webapp.web.live.run_state import DONE, REASONING, TEXT, TOOL

RESET = "reset"  # the whole reply as it is now, after a stale position

ALL = (TEXT, REASONING, TOOL, DONE, RESET)
COALESCED = (TEXT, REASONING)  # consecutive records of these may merge into one event
