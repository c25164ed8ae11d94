"""The SSE event names: the run log writes them and the templates listen for them.

Defined here only. Templates reach them as ``events.TEXT`` and so on (a
global of the template environment), and a test fails if any template names
an event this module does not, so the two cannot drift apart.
"""

from __future__ import annotations

TEXT = "text"  # escaped text appended to the reply's .content
REASONING = "reasoning"  # escaped text appended to the reply's reasoning block
TOOL = "tool"  # a new tool card, or (out of band) a finished one replacing its card
DONE = "done"  # the final reply, swapped over the streaming one; the stream ends
RESET = "reset"  # the whole reply as it is now, after a stale position

ALL = (TEXT, REASONING, TOOL, DONE, RESET)
COALESCED = (TEXT, REASONING)  # consecutive records of these may merge into one event
