"""@tool: schemas from annotations and docstrings, invocation, errors."""

from __future__ import annotations

import asyncio
import time
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


@tool
def blocking_read(seconds: float) -> str:
    """Block the calling thread, as a slow file read or a blocking HTTP call does.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return f"slept {seconds}"


@tool
async def awaiting_read(seconds: float) -> str:
    """Wait without blocking.

    Args:
        seconds: how long
    """
    await asyncio.sleep(seconds)
    return f"waited {seconds}"


async def test_a_synchronous_tool_runs_off_the_event_loop():
    ticks = 0
    done = asyncio.Event()

    async def tick() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.get_running_loop().create_task(tick())
    await asyncio.sleep(0)  # the ticker is running
    ctx = RunContext(run_id="r", session_id=None)
    result = await blocking_read.invoke(
        ctx, ToolCallEntry("c1", "blocking_read", '{"seconds": 0.5}')
    )
    done.set()
    await ticker
    assert result.output == "slept 0.5" and not result.is_error
    # On the loop the ticker would have had no turn at all during the 0.5 s; in a thread it
    # ticks every 10 ms. Only the order of magnitude is asserted (a loaded machine is slow).
    assert ticks >= 5


async def test_a_coroutine_tool_runs_on_the_loop_and_its_result_is_awaited():
    ctx = RunContext(run_id="r", session_id=None)
    result = await awaiting_read.invoke(ctx, ToolCallEntry("c1", "awaiting_read", '{"seconds": 0}'))
    assert result.output == "waited 0" and not result.is_error
