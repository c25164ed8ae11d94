"""@tool: schemas from annotations and docstrings, invocation, errors."""

from __future__ import annotations

from typing import Literal

import pytest

from webapp import RunContext, tool
from webapp.transcript import ToolCallEntry


@tool
def search(
    ctx: RunContext,
    query: str,
    limit: int = 5,
    mode: Literal["fast", "deep"] = "fast",
    tags: list[str] | None = None,
    ratio: float = 0.5,
    exact: bool = False,
) -> list[str]:
    """Search the notes.

    Longer explanation that is not part of the summary.

    Args:
        query: what to look for
        limit: at most this many hits,
            counted after filtering
    """
    return [query] * limit


def test_schema_from_annotations_and_docstring():
    assert search.name == "search"
    assert search.description == "Search the notes."
    assert search.takes_context
    props = search.parameters["properties"]
    assert "ctx" not in props
    assert props["query"] == {"type": "string", "description": "what to look for"}
    assert props["limit"] == {
        "type": "integer",
        "description": "at most this many hits, counted after filtering",
    }
    assert props["mode"] == {"enum": ["fast", "deep"]}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["ratio"] == {"type": "number"} and props["exact"] == {"type": "boolean"}
    assert search.parameters["required"] == ["query"]


async def test_invoke_passes_context_and_serializes_results():
    ctx = RunContext("r", "s", 3)
    result = await search.invoke(ctx, ToolCallEntry("c", "search", '{"query": "x", "limit": 2}'))
    assert result.output == '["x", "x"]' and not result.is_error


async def test_invalid_json_arguments_are_an_error_result():
    result = await search.invoke(RunContext("r", None), ToolCallEntry("c", "search", "{not json"))
    assert result.is_error and "not valid JSON" in result.output


async def test_empty_arguments_mean_no_arguments():
    @tool
    async def ping() -> str:
        """Ping."""
        return "pong"

    assert (
        await ping.invoke(RunContext("r", None), ToolCallEntry("c", "ping", ""))
    ).output == "pong"
    assert ping.parameters == {"type": "object", "properties": {}}


def test_named_tool_and_bad_names():
    @tool(name="lookup-v2")
    def f(x: str) -> str:
        """F."""
        return x

    assert f.name == "lookup-v2"
    with pytest.raises(ValueError, match="tool name"):
        tool(name="has spaces")(lambda: None)
