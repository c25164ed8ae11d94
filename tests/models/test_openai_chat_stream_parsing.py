"""Reading the Chat Completions stream: lines split anywhere, the fast path for text.

The adapter splits the byte stream into lines itself and takes plain text
deltas on a fast path; these pin that both read exactly what the general
reading did, however a server cuts its stream into pieces.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
from chat_server import ChatServer, Reply, chunk, sse, usage_chunk

from webapp.models import OpenAIChatModel
from webapp.models.chat_stream import SSELines, StreamState
from webapp.runtime.model import (
    FinishPart,
    ModelPart,
    ModelRequest,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    UsagePart,
)
from webapp.transcript import UserEntry
from webapp.usage import Usage


async def collect(model: OpenAIChatModel) -> list[ModelPart]:
    request = ModelRequest("", [UserEntry("hi")])

    async def run() -> list[ModelPart]:
        return [part async for part in model.stream(request)]

    return await asyncio.wait_for(run(), timeout=10)


def data(delta: dict[str, object], finish_reason: str | None = None) -> str:
    return chunk(delta, finish_reason).removesuffix("\n\n")


async def test_lines_split_across_pieces_read_as_whole_lines(
    chat_server: ChatServer, chat_model: OpenAIChatModel
):
    first, second = data({"content": "Hé"}), data({"content": "llo"})
    # The pauses make each piece its own read: pieces that arrive together are read as one.
    body: list[str | float] = [
        first[:20],  # a line cut in the middle ...
        0.05,
        first[20:] + "\r",  # ... and a CRLF cut between its CR ...
        0.05,
        "\n\r\n: keep-alive\r" + second + "\r\r",  # ... and its LF; CR alone ends lines too
        0.05,
        data({}, "stop"),  # the last line, with no line break at all
    ]
    chat_server.script.append(Reply(body=body))
    assert await collect(chat_model) == [TextPart("Hé"), TextPart("llo"), FinishPart("stop")]


async def test_several_chunks_in_one_piece_and_usage_null_on_every_chunk(
    chat_server: ChatServer, chat_model: OpenAIChatModel
):
    # OpenAI sends "usage": null on every chunk when usage is asked for.
    def with_null_usage(delta: dict[str, object], finish: str | None = None) -> str:
        payload = json.loads(data(delta, finish).removeprefix("data: "))
        return sse({**payload, "usage": None})

    together = "".join(with_null_usage({"content": c}) for c in ("a", "b", "c"))
    body: list[str | float] = [
        together,
        with_null_usage({"content": "d"}, "stop"),  # text and the finish in one chunk
        usage_chunk(3, 4),
        sse("[DONE]"),
    ]
    chat_server.script.append(Reply(body=body))
    parts = await collect(chat_model)
    texts = [p.text for p in parts if isinstance(p, TextPart)]
    # the stream's first text goes on at once, before the rest of its piece is
    # parsed; the other chunks that arrived in one piece go on as one part: one
    # wake-up, not two
    assert "".join(texts) == "abcd" and texts[0] == "a" and texts[1].startswith("bc")
    assert parts[len(texts) :] == [UsagePart(Usage(3, 4)), FinishPart("stop")]


def test_the_fast_path_reads_what_the_general_reading_reads():
    cases: list[tuple[dict[str, object], list[ModelPart]]] = [
        ({"choices": [{"delta": {"content": "x"}}]}, [TextPart("x")]),
        ({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, []),
        ({"choices": [{"delta": {"role": "assistant", "content": None}}]}, []),
        (
            {"choices": [{"delta": {"content": "x", "reasoning_content": "r"}}]},
            [
                ReasoningPart("r"),
                TextPart("x"),
            ],
        ),
        ({"choices": [{"delta": {"content": "x"}, "finish_reason": "length"}]}, [TextPart("x")]),
        ({"choices": [{"delta": {"content": 5}}]}, []),
    ]
    for chunk_, parts in cases:
        state = StreamState()
        assert state.feed(chunk_, "endpoint") == parts, chunk_
    state = StreamState()
    state.feed({"choices": [{"delta": {"content": "x"}, "finish_reason": "length"}]}, "e")
    assert state.finish_reason == "length"
    call = {"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}
    state.feed({"choices": [{"delta": {"content": "", "tool_calls": [call]}}]}, "e")
    assert state.final_parts()[0] == ToolCallPart("c1", "f", "{}")


def test_a_character_split_between_pieces_is_whole_in_its_line():
    lines = SSELines()
    encoded = 'data: {"x": "é€😀"}\n'.encode()
    pieces = [encoded[:10], encoded[10:11], encoded[11:17], encoded[17:]]
    assert [line for piece in pieces for line in lines.split(piece)] == [encoded.rstrip(b"\n")]
    assert json.loads(encoded[6:]) == {"x": "é€😀"}


async def test_a_read_of_many_chunks_goes_on_in_several_parts():
    class OnePiece(httpx.AsyncByteStream):
        def __init__(self, data: bytes) -> None:
            self.data = data

        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield self.data

    words = [f"w{i} " for i in range(300)]
    body = "".join(chunk({"content": w}) for w in words) + chunk({}, "stop") + sse("[DONE]")
    response = httpx.Response(
        200, headers={"content-type": "text/event-stream"}, stream=OnePiece(body.encode())
    )
    model = OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1")
    parts = [part async for part in model._read_stream(response)]
    texts = [p.text for p in parts if isinstance(p, TextPart)]
    # All 300 arrived in one read: they go on in a few parts, not one (the run may let
    # the event loop serve others between them) and not 300.
    assert "".join(texts) == "".join(words)
    assert 3 <= len(texts) <= 10
    assert parts[-1] == FinishPart("stop")
