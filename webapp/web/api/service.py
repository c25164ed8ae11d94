"""The API's runs (SPEC §16): a program's request becomes a run of a chat, and the run's
plain record (`webapp.web.live.reply.ReplyView`) becomes OpenAI's answer.

Each request runs in a chat of its own, owned by the key's person, so the
chat's model, the person's limits, the usage accounting, checkpoints, leases,
recovery after a crash and following a run from another process are all the
browser's (`webapp.web.live.runs`), unchanged. ``"store": true`` lists that
chat ("API"); otherwise it stays hidden (`webapp.chats.api_access`).

Invariants, each named for the failure it prevents:
- one run per person and ``Idempotency-Key``: the run id derives from both
  and the database's unique index decides a race, so a retried request is
  never billed twice;
- an ended run's answer is stored by the first reader that sees it end, so a
  replay is one read and no model call, and says the same (id, text, usage);
- a stream's positions count what the client has (`webapp.web.api.wire`), not
  an attempt's records, so a stream resumed on another process, or after a
  crash resumed the run, has no gap and no duplicate;
- a run nobody reads is stopped once nobody has read it for
  ``orphan_seconds`` (readers in any process mark ``seen_at``), so nothing is
  billed for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from webapp.chats.api_access import ApiRun, person_of
from webapp.chats.limits import LimitReached
from webapp.chats.settings import ChatSettings
from webapp.chats.store import ChatStore, NewRun
from webapp.chats.users import Owner
from webapp.models.endpoints import ModelRegistry
from webapp.stores.session import new_run_id
from webapp.transcript import Entry, UserEntry
from webapp.usage import Usage
from webapp.web.api import wire
from webapp.web.api.wire import ApiError, ApiRequest
from webapp.web.chat_service import ChatService
from webapp.web.live.reply import ReplyView
from webapp.web.live.run_state import RunState
from webapp.web.sse import BATCH_WINDOW
from webapp.web.view_models import title_from_text

logger = logging.getLogger("webapp.web.api")

ORPHAN_SECONDS = 30.0
IDEMPOTENCY_HOURS = 24.0
WAIT_FOR_RUN = 30.0  # how long a reader waits for a run it knows of to show up
_SEEN_EVERY = 2.0  # seconds between a reader's marks that it is still there
_POLL = 0.1


@dataclass(frozen=True)
class Ended:
    """An ended run's answer, as stored."""

    text: str
    finish_reason: str
    usage: Usage | None
    error: str | None
    calls: tuple[tuple[str, str, str], ...] = ()  # the caller's tool calls: id, name, arguments

    def to_json(self) -> str:
        usage = self.usage.to_dict() if self.usage is not None else None
        return json.dumps(
            {
                "text": self.text,
                "finish": self.finish_reason,
                "usage": usage,
                "error": self.error,
                "calls": [list(c) for c in self.calls],
            }
        )

    @classmethod
    def from_json(cls, raw: str) -> Ended:
        data = json.loads(raw)
        usage = Usage.from_dict(data["usage"]) if data.get("usage") else None
        calls = tuple((str(c[0]), str(c[1]), str(c[2])) for c in data.get("calls") or ())
        return cls(str(data["text"]), str(data["finish"]), usage, data.get("error"), calls)

    @classmethod
    def of(cls, reply: ReplyView) -> Ended:
        error = None
        if reply.status == "failed":
            error = reply.error or "The run failed."
        calls: tuple[tuple[str, str, str], ...] = ()
        if reply.status == "waiting":  # it called the caller's tools: theirs to run
            calls = tuple((c.call_id, c.name, c.arguments) for c in reply.tools if c.output is None)
        return cls(reply.text, wire.finish_reason(reply), reply.usage, error, calls)

    def as_reply(self, run_id: str) -> ReplyView:
        reply = ReplyView(run_id, "failed" if self.error else "completed", self.text)
        reply.cut_short = self.finish_reason == "length"
        reply.usage, reply.error = self.usage, self.error
        return reply


def derived_run_id(person: str, key: str, period: int) -> str:
    """The run id of a person's idempotency key. One run per person and key is the
    unique index's to decide (`ApiRuns.add`); ``period`` (the keeping time's, counted
    since 1970) makes the key used again after it expired a run of its own, whose id
    never meets the old run's, which a stored chat keeps."""
    return hashlib.sha256(f"api\0{person}\0{key}\0{period}".encode()).hexdigest()[:32]


class ApiService:
    def __init__(
        self,
        *,
        chats: ChatService,
        store: ChatStore,
        models: ModelRegistry,
        token: str | None = None,
        orphan_seconds: float = ORPHAN_SECONDS,
        idempotency_hours: float = IDEMPOTENCY_HOURS,
    ) -> None:
        self.chats = chats
        self.store = store
        self.runs = chats.runs
        self.models = models  # the models on offer (the picker's)
        self.token = token  # with --auth token, the access token is a key too
        self.orphan_seconds = orphan_seconds
        self.keep_seconds = idempotency_hours * 3600.0
        self._readers: dict[str, int] = {}
        self._watching: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._purged = 0.0

    def model_names(self) -> list[str]:
        return self.models.names()

    # --- starting ------------------------------------------------------------------

    async def start(self, owner: Owner, request: ApiRequest, key: str | None) -> ApiRun:
        """The run for ``request``: a new one, or the one its idempotency key named."""
        person = person_of(owner)
        if key is not None:
            found = await self.store.api_runs.by_key(person, key)
            if found is not None:
                return _same_body(found, request)
        if request.model not in self.model_names():
            raise ApiError(
                404,
                f"The model {request.model!r} does not exist here: see GET /v1/models.",
                "model_not_found",
            )
        self._purge_now()
        await self.store.admits(owner)  # `LimitReached`: the view answers 429
        period = int(time.time() // self.keep_seconds)
        run_id = derived_run_id(person, key, period) if key is not None else new_run_id()
        chat = await self.store.create(owner)
        run = ApiRun(
            run_id,
            chat.id,
            person,
            key,
            request.body_hash,
            request.model,
            not request.store,
            time.time(),
            json.dumps(request.tools),
        )
        recorded = await self.store.api_runs.add(run)
        if recorded.chat_id != chat.id:  # the same key, a moment earlier (any process)
            await self.store.delete(owner, chat.id, [])
            return _same_body(recorded, request)
        settings = ChatSettings(
            request.model, request.instructions, request.temperature, request.max_tokens
        )
        await self.store.settings.apply(chat.id, settings)
        await self.store.api_runs.seed(chat.id, request.history)
        entries: list[Entry] | None = None
        text = request.text
        if text is None:  # after tool results: the history is all of it; no new input
            text, entries = "", []
        title = title_from_text(_first_user_text(request))
        new = NewRun(run_id, "send", title=title, owner=owner)
        try:
            async with self.runs.lock(chat.id):
                await self.runs.start(chat.id, new, text, entries=entries)
        except LimitReached:  # decided in the database, with the run's record
            await self.store.api_runs.forget(run_id)
            await self.store.delete(owner, chat.id, [])
            raise
        return run

    async def find(self, owner: Owner, run_id: str) -> ApiRun:
        found = await self.store.api_runs.get(person_of(owner), run_id)
        if found is None:
            raise ApiError(404, f"There is no run {run_id!r} of yours.", "run_not_found")
        return found

    async def cancel(self, run: ApiRun) -> None:
        """Stop the run wherever it runs (§6's Stop): what it wrote so far is its answer."""
        await self.chats.stop(run.owner, run.chat_id, run.run_id)

    # --- reading -------------------------------------------------------------------

    async def ended(self, run: ApiRun) -> Ended:
        """Wait for the run's end (reading it like a stream); its answer."""
        async for _ in self.stream(run, None):
            pass
        raw = await self.store.api_runs.answer(run.run_id)
        if raw is None:  # its record went meanwhile (expired): say so, as a failure
            return Ended("", "stop", None, "The run's record is gone; send the request again.")
        return Ended.from_json(raw)

    async def stream(self, run: ApiRun, after: int | None) -> AsyncIterator[tuple[int, str]]:
        """(id, text) of the content after position ``after``, then one (id, "") per
        chunk after the content once the run ended: see `chunks`."""
        sent = after or 0
        loop = asyncio.get_running_loop()
        sent_at = -1.0  # when the last batch went: at most one per `BATCH_WINDOW`
        async with self.reading(run):
            found = await self._source(run)
            while True:
                if found is None:  # starting, or resumed after a crash: look again soon
                    await asyncio.sleep(_POLL)
                    found = await self._source(run)
                    continue
                if isinstance(found, RunState) and not found.finished:
                    wait = sent_at + BATCH_WINDOW - loop.time()
                    if wait > 0:  # deltas that come meanwhile go out as one chunk
                        await asyncio.sleep(wait)
                text = found.text if isinstance(found, Ended) else found.reply.text
                if len(text) > sent:
                    yield len(text), text[sent:]
                    sent, sent_at = len(text), loop.time()
                if isinstance(found, Ended):
                    return
                if found.finished:  # its end (or, abandoned, its next attempt)
                    found = await self._source(run)
                    continue
                # The same live run from here on: no database read per batch of tokens.
                seq = found.seq
                await found.wait_beyond(seq, 1.0)

    async def chunks(
        self, run: ApiRun, after: int | None, include_usage: bool
    ) -> AsyncIterator[tuple[int | None, dict[str, object] | str]]:
        """The stream as OpenAI sends it: (SSE id, chunk), then (None, "[DONE]")."""
        created, model = int(run.created_at), run.model
        if after is None:
            yield 0, wire.chunk(run.run_id, created, model, {"role": "assistant", "content": ""})
        async for position, text in self.stream(run, after):
            yield position, wire.chunk(run.run_id, created, model, {"content": text})
        end = await self._stored_end(run)
        if end.error is not None:
            yield None, ApiError(502, end.error, "run_failed", "server_error").body()
            return
        had, length = after or 0, len(end.text)
        for index, call in enumerate(end.calls):
            if had < length + 1 + index:
                delta = {"tool_calls": [{"index": index, **wire.tool_calls_json([call])[0]}]}
                yield length + 1 + index, wire.chunk(run.run_id, created, model, delta)
        length += len(end.calls)
        if had < length + 1:
            yield length + 1, wire.chunk(run.run_id, created, model, {}, end.finish_reason)
        if include_usage and had < length + 2:
            yield length + 2, wire.chunk(run.run_id, created, model, {}, usage=end.usage or None)
        yield None, "[DONE]"

    async def _stored_end(self, run: ApiRun) -> Ended:
        """The answer of a run `stream` saw end (kept by then)."""
        raw = await self.store.api_runs.answer(run.run_id)
        return Ended.from_json(raw) if raw is not None else await self.ended(run)

    async def _source(self, run: ApiRun) -> RunState | Ended | None:
        """The run live (here or in another process), or its answer once it ended; None
        while neither shows yet (it is starting, or being resumed after a crash)."""
        raw = await self.store.api_runs.answer(run.run_id)
        if raw is not None:
            return Ended.from_json(raw)
        state = await self.runs.follow(run.chat_id, run.run_id)
        if state is not None and not state.abandoned:
            if not state.finished:
                return state
            return None if state.reply.status == "streaming" else await self._end(run, state.reply)
        chat = await self.store.get(run.owner, run.chat_id)
        if chat is None:
            return None
        shown = await self.chats.current_reply(run.owner, run.chat_id, run.run_id)
        reply = getattr(shown, "reply", None)
        if not isinstance(reply, ReplyView) or reply.status == "streaming":
            return None
        if chat.active_run_id == run.run_id and reply.status != "waiting":
            return None  # in flight: it shows once it starts (or is resumed)
        return await self._end(run, reply)

    async def _end(self, run: ApiRun, reply: ReplyView) -> Ended:
        """The run's answer, kept; a run that called the caller's tools ends here (it
        waits for them; the caller's next request brings their results)."""
        end = await self._keep(run, Ended.of(reply))
        if reply.status == "waiting":
            await self.chats.stop(run.owner, run.chat_id, run.run_id)
        return end

    async def _keep(self, run: ApiRun, end: Ended) -> Ended:
        await self.store.api_runs.keep_answer(run.run_id, end.to_json())
        raw = await self.store.api_runs.answer(run.run_id)  # another reader's may be first
        return Ended.from_json(raw) if raw is not None else end

    # --- readers and orphans ------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def reading(self, run: ApiRun) -> AsyncIterator[None]:
        """A client reads the run for the block; when the last one leaves, the orphan
        watch starts."""
        run_id = run.run_id
        self._readers[run_id] = self._readers.get(run_id, 0) + 1
        fresh = time.time() - run.created_at < _SEEN_EVERY  # its row says seen already
        marker = asyncio.get_running_loop().create_task(self._mark_seen(run_id, fresh))
        try:
            yield
        finally:
            marker.cancel()
            left = self._readers.get(run_id, 1) - 1
            if left > 0:
                self._readers[run_id] = left
            else:
                self._readers.pop(run_id, None)
                self._watch(run)

    async def _mark_seen(self, run_id: str, fresh: bool) -> None:
        while True:
            if fresh:  # the row was made seen a moment ago: no write on the way to a token
                await asyncio.sleep(_SEEN_EVERY)
            fresh = True
            try:
                await self.store.api_runs.seen(run_id)
            except Exception:  # a missed mark only brings the orphan watch a little closer
                logger.warning("run %s: could not mark its reader", run_id, exc_info=True)

    def _watch(self, run: ApiRun) -> None:
        if run.run_id in self._watching:
            return
        self._watching.add(run.run_id)
        task = asyncio.get_running_loop().create_task(self._orphan_watch(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _orphan_watch(self, run: ApiRun) -> None:
        try:
            while True:
                seen = await self.store.api_runs.seen_at(run.run_id)
                if seen is None or await self.store.api_runs.answer(run.run_id) is not None:
                    return
                chat = await self.store.get(run.owner, run.chat_id)
                if chat is None or chat.active_run_id != run.run_id:
                    return
                idle = time.time() - seen
                if self._readers.get(run.run_id) or idle < self.orphan_seconds:
                    await asyncio.sleep(max(0.2, min(1.0, self.orphan_seconds - idle)))
                    continue
                logger.info("run %s: every client has gone; stopping it", run.run_id)
                await self.cancel(run)
                await self._source(run)  # its answer is kept for a later replay
                return
        except Exception:
            logger.exception("run %s: the orphan watch failed", run.run_id)
        finally:
            self._watching.discard(run.run_id)

    def _purge_now(self) -> None:
        """Start `_purge` in the background, at most once a minute (or a quarter of the
        keeping time, if shorter) on a start: a request never waits for it."""
        now = time.time()
        if now - self._purged < min(60.0, self.keep_seconds / 4):
            return
        self._purged = now
        task = asyncio.get_running_loop().create_task(self._purge(now))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _purge(self, now: float) -> None:
        """Idempotency records older than ``keep_seconds`` go, with their hidden chats."""
        try:
            await self._expire(now)
        except Exception:  # the next start tries again
            logger.exception("could not remove expired API runs")

    async def _expire(self, now: float) -> None:
        expired = await self.store.api_runs.expired(now - self.keep_seconds)
        for run_id, chat_id, hidden in expired:
            if hidden:
                await self.chats.delete(Owner(None), chat_id)
        if expired:
            await self.store.api_runs.remove([r for r, _, _ in expired])

    async def watch_owed(self) -> int:
        """At start-up: the API runs this process may have resumed, watched as orphans
        from now on (a client that comes back within the orphan time keeps its run)."""
        owed = await self.store.api_runs.unanswered(time.time() - self.keep_seconds)
        for run in owed:
            self._watch(run)
        return len(owed)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def _first_user_text(request: ApiRequest) -> str:
    for turn in request.history:
        for entry in turn:
            if isinstance(entry, UserEntry):
                return entry.text
    return request.text or "API request"


def _same_body(found: ApiRun, request: ApiRequest) -> ApiRun:
    if found.body_hash != request.body_hash:
        raise ApiError(
            422,
            "This Idempotency-Key was used with a different request body; use a new key.",
            "idempotency_key_reused",
        )
    return found
