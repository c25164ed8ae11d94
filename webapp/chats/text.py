"""What user text may hold, wherever it enters: the message form or an imported file.

One set of rules for both doors, each named for the failure it prevents:
- no C0 control characters but tab, line feed and carriage return, and no DEL:
  a NUL or an escape would otherwise be stored and reach the HTML as raw bytes;
  they are taken out, as the message box takes them out of what is typed;
- no lone surrogate (half of a UTF-16 pair, which JSON can spell ``\\ud800``):
  it has no UTF-8 form, so the database could not store it;
- a sent message is at most `MAX_MESSAGE_CHARS` characters (the app's default:
  `create_app(max_message_chars=...)` sets its own), a title at most
  `MAX_TITLE_CHARS`, on one line.
"""

from __future__ import annotations

import re

MAX_MESSAGE_CHARS = 100_000
MAX_TITLE_CHARS = 200

# C0 controls but tab, line feed and carriage return, plus DEL: no user text needs them.
_CONTROLS = dict.fromkeys([*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` without C0 control characters other than tab, line feed and carriage return."""
    return text.translate(_CONTROLS)


def message_text(text: str) -> str:
    """A message as it is stored: cleaned, with every line break a line feed."""
    return clean_text(text).replace("\r\n", "\n").replace("\r", "\n")


def title_line(text: str) -> str:
    """A title as it is stored: cleaned, on one line, single spaces."""
    return " ".join(clean_text(text).split())


def has_lone_surrogate(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def shortened_title(title: str, suffix: str = "") -> str:
    """``title`` followed by ``suffix``, the title cut (with "…") so that both fit in
    `MAX_TITLE_CHARS`: a title made from another one can never outgrow the limit."""
    room = MAX_TITLE_CHARS - len(suffix)
    if len(title) > room:
        title = title[: room - 1].rstrip() + "…"
    return title + suffix
