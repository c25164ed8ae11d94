"""A real MCP server for the tests, written with the SDK: `python tests/mcp_server.py DIR [http PORT]`.

Its tools leave traces in DIR, so a test can tell what the server really did:
``write_note`` appends a line to ``DIR/notes.txt`` (not read-only, not
idempotent: the tool approvals exist for), ``slow`` records its start and, when
the client cancels it, ``cancelled`` in ``DIR/slow.log``.
"""

from __future__ import annotations

import asyncio
import base64
import sys
from pathlib import Path

from mcp.server.fastmcp import FastMCP, Image
from mcp.types import ToolAnnotations

DIR = Path(sys.argv[1])
HTTP_PORT = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "http" else None
# A 1x1 PNG, red.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)

server = FastMCP("test-tools", host="127.0.0.1", port=HTTP_PORT or 8000, log_level="WARNING")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def write_note(text: str) -> str:
    """Append a line to the notes file."""
    with (DIR / "notes.txt").open("a", encoding="utf-8") as f:
        f.write(text + "\n")
    return f"wrote {text!r}"


@server.tool(annotations=ToolAnnotations(idempotentHint=True))
def set_flag(name: str) -> str:
    """Set a flag (setting it twice changes nothing)."""
    (DIR / f"flag-{name}").write_text("set", encoding="utf-8")
    return f"flag {name} set"


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep for a while, noting the start and any cancellation."""
    log = DIR / "slow.log"
    with log.open("a", encoding="utf-8") as f:
        f.write("started\n")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        with log.open("a", encoding="utf-8") as f:
            f.write("cancelled\n")
        raise
    return "slept"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def fail(reason: str) -> str:
    """Always fails."""
    raise ValueError(f"failed on purpose: {reason}")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def picture() -> Image:
    """A small picture."""
    return Image(data=PNG, format="png")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True), structured_output=True)
def weather(city: str) -> dict[str, object]:
    """Structured weather."""
    return {"city": city, "celsius": 21, "sky": "<b>clear</b>"}


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def big(chars: int) -> str:
    """A long text."""
    return "".join(str(i % 10) for i in range(chars))


if __name__ == "__main__":
    server.run("streamable-http" if HTTP_PORT else "stdio")
