"""The SSE event names live in one module; the templates must use exactly those."""

from __future__ import annotations

import re
from pathlib import Path

from webapp.web import event_names
from webapp.web.assets import TEMPLATES_DIR

SSE_ATTRS = re.compile(r'sse-(?:swap|close)="([^"]*)"')
REFERENCE = re.compile(r"^\{\{\s*events\.([A-Z_]+)\s*\}\}$")


def listened_names() -> dict[str, set[str]]:
    """For each template, the names its sse-swap / sse-close attributes refer to."""
    found: dict[str, set[str]] = {}
    for path in sorted(Path(TEMPLATES_DIR).glob("*.html")):
        for value in SSE_ATTRS.findall(path.read_text()):
            for part in value.split(","):
                match = REFERENCE.match(part.strip())
                assert match, f"{path.name}: {part!r} names an event literally; use events.NAME"
                assert hasattr(event_names, match.group(1)), (
                    f"{path.name}: events.{match.group(1)} is not in webapp.web.event_names"
                )
                found.setdefault(path.name, set()).add(getattr(event_names, match.group(1)))
    return found


def test_templates_name_events_only_through_the_module():
    names = set().union(*listened_names().values())
    # Every event the server sends is listened for somewhere, and nothing else is.
    assert names == set(event_names.ALL)
