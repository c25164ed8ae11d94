"""A reader of one reply's event stream that behaves like the page's EventSource.

It reconnects with ``Last-Event-ID`` after a dropped connection (a 503 or a
dead server included), applies ``text`` deltas, and replaces the whole reply on
``reset`` (then follows the reset fragment's own ``sse-connect``) and on
``done``. Every state the reply went through on screen is kept in ``shown``,
so a test can measure how far it ever went back.
"""

from __future__ import annotations

import asyncio
import html
import itertools
import time
from dataclasses import dataclass, field

import httpx
from webhelpers import SSEvent, parse_html, parse_sse, text_of_fragments


@dataclass
class Follower:
    http: httpx.AsyncClient
    url: str  # absolute: a reset's relative ``sse-connect`` is resolved against it
    text: str = ""
    last_id: str | None = None
    done: bool = False
    shown: list[str] = field(default_factory=list)
    resets: int = 0
    reset_at: list[float] = field(default_factory=list)  # time.time() of each reset
    shown_at: list[float] = field(default_factory=list)  # time.time() of each of `shown`
    shown_by: list[str] = field(default_factory=list)  # the event that made each of `shown`

    async def follow(self, timeout: float) -> None:
        """Read until the ``done`` event (reconnecting as often as needed)."""
        await asyncio.wait_for(self._follow(), timeout)

    async def _follow(self) -> None:
        while not self.done:
            headers = {"Last-Event-ID": self.last_id} if self.last_id else {}
            try:
                async with self.http.stream("GET", self.url, headers=headers) as response:
                    if response.status_code == 200:
                        await self._read(response)
            except httpx.TransportError:
                pass  # the server is gone: retry, as the browser does
            if not self.done:
                await asyncio.sleep(0.1)

    async def _read(self, response: httpx.Response) -> None:
        buffer = ""
        async for chunk in response.aiter_text():
            buffer += chunk.replace("\r\n", "\n")
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                for event in parse_sse(block + "\n\n"):
                    if self._apply(event):
                        return

    def _apply(self, event: SSEvent) -> bool:
        """Apply one event; True when this connection is over (a reset or the end)."""
        if event.id:
            self.last_id = event.id
        if event.event == "text":
            self.text += text_of_fragments([event])
        elif event.event in ("reset", "done"):
            reply = parse_html(event.data).find(data_role="assistant")
            assert reply is not None, event.data[:300]
            content = reply.find(class_="content")
            self.text = content.text() if content is not None else ""
            if event.event == "done" or reply.attrs.get("data-status") != "streaming":
                self.done = True  # a reset to the finished reply: nothing more to follow
            else:
                self.resets += 1
                self.reset_at.append(time.time())
                connect = html.unescape(reply.attrs.get("sse-connect") or "")
                self.url = str(httpx.URL(self.url).join(connect)) if connect else self.url
                self.last_id = None  # the fragment's own position is in its URL
        else:
            return False
        self.shown.append(self.text)
        self.shown_at.append(time.time())
        self.shown_by.append(event.event)
        return event.event in ("reset", "done")

    @classmethod
    def of_send(cls, http: httpx.AsyncClient, base: str, answer: str) -> Follower:
        """The page as a send's answer (``answer``, its HTML) left it: the reply's text
        so far, and its stream (``base``: the server's URL, for a relative one)."""
        reply = parse_html(answer).find(data_role="assistant")
        assert reply is not None and reply.attrs.get("sse-connect"), answer[:300]
        content = reply.find(class_="content")
        url = str(httpx.URL(base + "/").join(html.unescape(reply.attrs["sse-connect"] or "")))
        return cls(http, url, content.text() if content is not None else "")

    def words_seen(self) -> int:
        return len(self.text.split())


def most_words_gone_back(shown: list[str]) -> int:
    """The most words the reply ever lost from one state on screen to the next."""
    worst = 0
    for before, after in itertools.pairwise(shown):
        old, new = before.split(), after.split()
        kept = 0
        while kept < min(len(old), len(new)) and old[kept] == new[kept]:
            kept += 1
        worst = max(worst, len(old) - kept)
    return worst
