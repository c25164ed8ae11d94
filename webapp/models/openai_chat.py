"""OpenAIChatModel: any OpenAI-compatible Chat Completions endpoint, streamed.

Works with OpenAI, Ollama, vLLM, llama.cpp's server, LM Studio and the like.
One pooled `httpx.AsyncClient` per model instance (created on first use,
released by `aclose()`), `stream=True` with usage included, tool calls
assembled from their deltas by index and yielded whole when the stream ends.

Every failure becomes a `ModelError` a user can act on: it names the endpoint
URL, the HTTP status and the provider's own error text. The API key never
appears in an error or a log line -- it is only ever put in the Authorization
header, and any provider text that echoes it is redacted.

Retries: 429 and 5xx answers are retried a few times with backoff that
honours Retry-After. That can only happen before the first token, because
a status arrives before the body; once text has streamed, replaying the call
would show the user the same words twice, so mid-stream failures are final.

No other retry exists. The client is a plain `httpx.AsyncClient` on httpx's
own transport, which retries nothing once a request is on its way (see
`_http`): a connection that drops after the request was sent -- a reused
keep-alive one included -- is a failure naming the endpoint, since the
endpoint may have received the request and started a generation that a
resend would pay for twice.

Cancelling the consuming task closes the HTTP response (and with it the
connection, since the body was not read to the end), which is how an
OpenAI-compatible server learns to stop generating.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

import httpx

from webapp.errors import ModelError
from webapp.models.chat_request import (
    PREFILL_REFUSED,
    Continuation,
    ask_body,
    build_messages,
    check_continuation,
    ends_with_partial_reply,
    prefill_body,
    tool_definition,
)
from webapp.models.chat_stream import (
    MAX_ERROR_TEXT,
    SSELines,
    StreamState,
    error_text,
    merged,
    parts_from_completion,
)
from webapp.runtime.model import ModelPart, ModelRequest

_JSON = json.JSONDecoder()
logger = logging.getLogger("webapp.models.openai_chat")

_MAX_ERROR_BODY = 64 * 1024
_DRAIN_SECONDS = 1.0
_SSE_FIELDS = frozenset({b"data", b"event", b"id", b"retry"})
_LINES_PER_PART = 128  # about 64 chunks: a third of a millisecond to parse


class OpenAIChatModel:
    """Streams Chat Completions from `base_url` (e.g. ``https://api.openai.com/v1``).

    `continuation` says how a request with ``continue_final`` (an unfinished
    reply to go on with) is sent: "prefill" sends the partial reply last with
    vLLM's ``continue_final_message`` (llama.cpp prefills from it by itself);
    "ask" adds a user message asking the model to continue; "auto" (default)
    tries prefill and, if the endpoint refuses it with HTTP 400/422, asks
    instead -- and once asking has worked, this instance keeps asking.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        api_key: str | None = None,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        max_retries: int = 3,
        retry_backoff: float = 0.5,
        max_retry_wait: float = 20.0,
        temperature: float | None = None,
        max_tokens: int | None = None,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        continuation: Continuation = "auto",
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise ValueError("model must be a non-empty model name, e.g. 'gpt-4o-mini'")
        self.model = model.strip()
        self.base_url = _check_base_url(base_url)
        self.endpoint = self.base_url + "/chat/completions"
        self._public_endpoint = _public_url(self.endpoint)  # named in errors; read per chunk
        self._endpoint_url = httpx.URL(self.endpoint)  # parsed once, not on every request
        self._api_key = api_key or None
        for name, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        for name, value in (("retry_backoff", retry_backoff), ("max_retry_wait", max_retry_wait)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0 seconds, got {value!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.max_retries = max_retries
        self.retry_backoff = float(retry_backoff)
        self.max_retry_wait = float(max_retry_wait)
        self.temperature = temperature
        self.max_tokens = max_tokens
        self._headers = dict(headers or {})
        self._extra_body = dict(extra_body or {})
        self.continuation = check_continuation(continuation)
        self._prefill_refused = False  # "auto" learnt that this endpoint refuses prefill
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        # Deliberately without the API key: reprs end up in logs and tracebacks.
        return f"OpenAIChatModel({self.model!r}, base_url={_public_url(self.base_url)!r})"

    @property
    def public_endpoint(self) -> str:
        """The endpoint URL safe to show: credentials embedded in it are removed."""
        return self._public_endpoint

    async def aclose(self) -> None:
        """Close the pooled HTTP client; the next request opens a new one."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _http(self) -> httpx.AsyncClient:
        # A client is bound to the event loop it first ran on; a model used
        # from another loop (tests, a restarted app) gets a fresh client.
        loop = asyncio.get_running_loop()
        if self._client is None or self._client.is_closed or self._client_loop is not loop:
            # Every connection stays open for the next request: one chat per
            # connection streams at a time, and a new one costs a handshake.
            limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
            # httpx's own transport, on purpose: trust_env mounts the proxies that
            # HTTP(S)_PROXY / ALL_PROXY / NO_PROXY name and reads SSL_CERT_FILE and
            # SSL_CERT_DIR. It never sends a request twice: its `retries` (0 by
            # default, left so) repeat only a failed connect, and httpcore 1.0's pool
            # moves a request to another connection only on ConnectionNotAvailable,
            # raised before a byte of it is written (httpcore/_async/http11.py); an
            # idle connection the server has closed is dropped before reuse.
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout, connect=self.connect_timeout),
                limits=limits,
                trust_env=True,
            )
            self._client_loop = loop
        return self._client

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        body, instead = self._bodies(request)
        attempt, asking = 0, False
        while True:
            answered = False  # the response's head arrived: a failure now is mid-response
            try:
                async with self._http().stream(
                    "POST", self._endpoint_url, json=body, headers=self._request_headers()
                ) as response:
                    answered = True
                    if response.status_code < 400:
                        self._prefill_refused |= asking  # remembered only once asking works
                        async for part in self._read_stream(response):
                            yield part
                        return
                    error = await self._http_error(response)
                    wait = self._retry_wait(response, attempt)
                    refused = instead is not None and response.status_code in PREFILL_REFUSED
            except httpx.HTTPError as exc:
                # Final, whatever the error: only an HTTP status is retried (below).
                raise self._transport_error(exc, answered) from exc
            if refused and instead is not None:
                logger.info(
                    "continuing by prefill was refused (%s); asking the model instead", error
                )
                body, instead, asking = instead, None, True
                continue
            if wait is None:
                raise error
            attempt += 1
            logger.warning(
                "%s; retrying in %.2f s (retry %d of %d)", error, wait, attempt, self.max_retries
            )
            await asyncio.sleep(wait)

    def _request_headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream", **self._headers}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _bodies(self, request: ModelRequest) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The body to send, and the one to send if the endpoint refuses prefill."""
        body = self._request_body(request)
        if not request.continue_final or not ends_with_partial_reply(body["messages"]):
            return body, None
        if self.continuation == "ask" or self._prefill_refused:
            return ask_body(body), None
        return prefill_body(body), (ask_body(body) if self.continuation == "auto" else None)

    def _request_body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": build_messages(request.system, request.entries),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = [tool_definition(spec) for spec in request.tools]
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        body.update(self._extra_body)
        return body

    async def _read_stream(self, response: httpx.Response) -> AsyncIterator[ModelPart]:
        content_type = response.headers.get("content-type", "")
        if content_type.startswith("application/json"):
            # A server that ignored stream=True answered with one whole completion.
            raw = await response.aread()
            for part in parts_from_completion(self._decode(raw)):
                yield part
            return
        if content_type.startswith("text/html"):
            raise ModelError(
                f"{self.public_endpoint} answered with an HTML page, not a Chat Completions "
                "stream; check --base-url (OpenAI-compatible servers usually end in /v1)"
            )
        state, lines = StreamState(), SSELines()
        # Bytes as they arrive, decoded by httpx only if the server compressed them
        # (two generator layers less per token when not): the lines are split here
        # (SSELines says why not `aiter_lines`).
        plain = response.headers.get("content-encoding", "identity").lower() == "identity"
        pieces = response.aiter_raw() if plain else response.aiter_bytes()
        size = 1  # lines at a time until the first part: it goes on before the rest is parsed
        async for piece in pieces:
            # A piece is one chunk of the HTTP body: for the common servers one event,
            # one token (measured: 1,000 tokens in a burst came as 1,000 pieces). A
            # server or proxy that packs several events into one chunk gets their texts
            # joined into one part, so what follows wakes once; hundreds of them go on
            # in parts of at most _LINES_PER_PART lines, so the run can let the event
            # loop serve others in between. (A burst's tokens are joined further on,
            # per turn of the event loop: `webapp.web.live.recorder`.)
            read, start = lines.split(piece), 0
            while start < len(read) and not state.done:
                batch: list[ModelPart] = []
                try:
                    self._parts(state, read[start : start + size], batch)
                except ModelError:
                    for part in batch:  # what came before a malformed chunk is kept
                        yield part
                    raise
                start += size
                if batch:
                    size = _LINES_PER_PART
                for part in batch:
                    yield part
            if state.done:
                break
        if state.done:
            await _finish_reading(pieces)
        else:  # a last line without its line break still counts
            batch = []
            try:
                self._parts(state, lines.split(b"\n"), batch)
            except ModelError:
                for part in batch:  # what came before a malformed chunk is kept
                    yield part
                raise
            for part in batch:
                yield part
        if not state.done and state.finish_reason is None:
            raise ModelError(
                f"the stream from {self.public_endpoint} ended before the model finished "
                "(no finish_reason and no [DONE]); the server may have dropped the connection"
            )
        for part in state.final_parts():
            yield part

    def _parts(self, state: StreamState, lines: list[bytes], into: list[ModelPart]) -> None:
        """The parts the SSE ``lines`` carry, appended to ``into`` as they come (a
        failure keeps what came before it) with each run of text or of reasoning
        joined into one part; a ``[DONE]`` payload ends the stream.

        Each ``data:`` line is one payload. The SSE standard would join
        consecutive data lines, but Chat Completions servers never split a
        chunk over lines, and some omit the blank separator line entirely.
        """
        for line in lines:
            if line.startswith(b"data:"):
                payload = line[6:] if line[5:6] == b" " else line[5:]
            elif not line or line.startswith(b":"):
                continue  # event separator or keep-alive comment
            else:
                name, _, payload = line.partition(b":")
                if name not in _SSE_FIELDS:
                    text = line[:200].decode("utf-8", "replace")
                    raise ModelError(
                        f"{self.public_endpoint} sent a malformed stream: expected Server-Sent "
                        f"Events 'data:' lines, got {self._redact(text)!r}"
                    )
                if name != b"data":
                    continue
            if payload.strip() == b"[DONE]":
                state.done = True
                return
            merged(state.feed(self._decode(payload), self.public_endpoint), into)

    def _decode(self, payload: bytes) -> dict[str, Any]:
        # Decoded here, not by json.loads: it would first guess the encoding,
        # once per token. SSE is UTF-8; a stray byte reads as U+FFFD, as in text.
        text = payload.decode("utf-8", "replace")
        try:
            try:  # a payload that is nothing but the object: no whitespace scans around it
                chunk, end = _JSON.raw_decode(text)
            except json.JSONDecodeError:
                end = -1
            if end != len(text):  # whitespace around it, or an error to name
                chunk = _JSON.decode(text)
            problem = "" if isinstance(chunk, dict) else "expected a JSON object"
        except json.JSONDecodeError as exc:
            problem = f"not JSON: {exc.msg}"
        if problem:
            shown = self._redact(payload[:200].decode("utf-8", "replace"))
            raise ModelError(
                f"{self.public_endpoint} sent a malformed stream chunk ({problem}): {shown!r}"
            )
        return chunk

    async def _http_error(self, response: httpx.Response) -> ModelError:
        raw = b""
        try:
            async for piece in response.aiter_bytes():
                raw += piece
                if len(raw) >= _MAX_ERROR_BODY:
                    break
        except httpx.HTTPError as exc:
            raw += f" (error body incomplete: {type(exc).__name__})".encode()
        detail = self._redact(_provider_message(raw.decode("utf-8", "replace")))
        status = response.status_code
        reason = response.reason_phrase or ""
        message = (
            f"model endpoint {self.public_endpoint} answered HTTP {status}"
            f"{' ' + reason if reason else ''}: {detail or '(no error text)'}"
        )
        hint = _status_hint(status, self.model)
        advised = _retry_after_seconds(response.headers.get("retry-after"))
        if advised is not None and advised > self.max_retry_wait:
            hint = f"{hint} (the server asked to wait {advised:g} s before retrying)".lstrip()
        return ModelError(f"{message}. {hint}" if hint else message)

    def _retry_wait(self, response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before retrying, or None when this answer is final."""
        if response.status_code != 429 and response.status_code < 500:
            return None
        if attempt >= self.max_retries:
            return None
        advised = _retry_after_seconds(response.headers.get("retry-after"))
        if advised is None:
            return min(self.retry_backoff * (2**attempt), self.max_retry_wait)
        # A server that asks for a longer pause than we are willing to sit
        # through will refuse an early retry too: fail now, saying how long.
        return advised if advised <= self.max_retry_wait else None

    def _transport_error(self, exc: httpx.HTTPError, answered: bool) -> ModelError:
        url = self.public_endpoint
        detail = self._redact(str(exc) or type(exc).__name__)
        if isinstance(exc, httpx.ConnectTimeout):
            text = f"cannot reach the model endpoint {url}: connecting timed out after "
            text += f"{self.connect_timeout:g} s; check --base-url and that the server is up"
        elif isinstance(exc, httpx.ConnectError):
            text = f"cannot reach the model endpoint {url}: it is unreachable ({detail}); "
            text += "check --base-url and that the server is running"
        elif isinstance(exc, httpx.ReadTimeout):
            text = f"the model endpoint {url} stalled: no data for {self.timeout:g} s "
            text += "(read timeout); the server may be overloaded -- try again"
        elif isinstance(exc, (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError)):
            if answered:
                text = f"the connection to the model endpoint {url} broke mid-response ({detail})"
            else:
                text = f"the connection to the model endpoint {url} closed before its answer "
                text += f"({detail}); the request may have reached it, so it was not sent again"
        elif isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
            text = f"the model endpoint URL {url} is not usable ({detail}); check --base-url"
        else:
            text = f"request to the model endpoint {url} failed: {type(exc).__name__}: {detail}"
        return ModelError(text)

    def _redact(self, text: str) -> str:
        if self._api_key and len(self._api_key) >= 4:
            return text.replace(self._api_key, "[redacted]")
        return text


async def _finish_reading(rest: AsyncIterator[bytes]) -> None:
    """Read what follows [DONE] so the connection can go back to the pool.

    A response left unread has to be closed, which costs a new connection
    (and TLS handshake) on the next call. Bounded: a server that keeps the
    stream open after [DONE] just loses its connection.
    """
    with contextlib.suppress(TimeoutError, httpx.HTTPError, ModelError):
        async with asyncio.timeout(_DRAIN_SECONDS):
            async for _ in rest:
                continue  # anything after [DONE] carries no meaning


def _provider_message(body: str) -> str:
    """The provider's own error text: JSON ``error.message`` if there is one, else the body."""
    text = body.strip()
    try:
        data = json.loads(text) if text else None
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        for key in ("error", "message", "detail"):
            if data.get(key):
                text = error_text(data[key])
                break
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + " ..."


def _status_hint(status: int, model: str) -> str:
    if status in (401, 403):
        return "Check the API key (--api-key or OPENAI_API_KEY)"
    if status == 404:
        return f"Check --base-url and that the model {model!r} exists there (--model)"
    if status == 429:
        return "The provider is rate-limiting; wait a moment and try again"
    if status >= 500:
        return "The model server failed; try again later"
    return ""


def _retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass  # not a number of seconds: maybe an HTTP date
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(moment.timestamp() - time.time(), 0.0)


def _check_base_url(base_url: str) -> str:
    if not isinstance(base_url, str) or not base_url.strip():
        raise ValueError("base_url must be the endpoint's URL, e.g. 'https://api.openai.com/v1'")
    url = base_url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"base_url {_public_url(url)!r} must be an http:// or https:// URL such as "
            "'http://localhost:11434/v1'"
        )
    url = url.removesuffix("/chat/completions")  # a common slip: the full endpoint was given
    return url


def _public_url(url: str) -> str:
    """The URL without any user:password@ part."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
