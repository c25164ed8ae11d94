"""Every chat-level operation: one method each, owning its chat's lock.

`ChatService` sits below the views and above the stores and runs. Each
operation (send, edit, regenerate, stop, rename, delete, and a new chat with
its first message) takes the chat's lock itself, settles a run that ended a
moment ago, reads the chat once, decides, acts, and returns a small typed
outcome. Views only turn outcomes into responses; nothing above this layer
takes a lock or reads state to decide.

Invariants, each named for the failure it prevents:
- one active run per chat, decided under the lock from durable state
  (``active_run_id``): two sends, or a send and an edit, never both start;
- a busy chat answers `Busy` before anything else is looked at, so an action
  taken while a reply streams is never mistaken for "nothing to regenerate";
- a deleted chat leaves nothing: delete cancels the chat's run and waits for
  it under the same lock a send needs, then removes the chat, its session and
  its checkpoints in one transaction, so a send racing a delete either lands
  first (and goes with the chat) or finds no chat;
- a client message id starts at most one run, also for the first message
  of a new chat (a double click or a retried POST lands on the same chat);
- every operation takes the `Owner` it acts for and passes it to the chat
  layer, whose queries filter by it: another person's chat is `ChatNotFound`,
  exactly like a chat that does not exist (SPEC §13);
- a send over a person's limits (`OverLimit`) writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace

from webapp.chats import file_format
from webapp.chats.attachments import NewFile
from webapp.chats.file_format import ChatFile, ChatFileError
from webapp.chats.intake import AttachmentRefused, Intake, Taken, Upload
from webapp.chats.limits import LimitReached
from webapp.chats.search import SearchHit
from webapp.chats.settings import ChatSettings
from webapp.chats.store import (
    AlreadySentError,
    Chat,
    ChatBusyError,
    ChatStore,
    NewRun,
    Page,
)
from webapp.chats.text import shortened_title
from webapp.chats.tool_approvals import Decision
from webapp.chats.users import Owner
from webapp.stores.checkpoint import Checkpointer
from webapp.stores.session import Segment, Session, new_run_id
from webapp.transcript import UserEntry
from webapp.web.live.run_state import RunState
from webapp.web.live.runs import RunManager
from webapp.web.outcomes import (
    AlreadySent,
    BadChatFile,
    Branched,
    BranchOutcome,
    Busy,
    CannotContinue,
    ChatNotFound,
    ContinueOutcome,
    DecideOutcome,
    Deleted,
    DeleteOutcome,
    EditOutcome,
    Imported,
    MessageNotFound,
    NewChatOutcome,
    NothingToRegenerate,
    OverLimit,
    RegenerateOutcome,
    Renamed,
    RenameOutcome,
    RunNotFound,
    SendOutcome,
    ShownReply,
    Started,
    StopOutcome,
    Switched,
    SwitchOutcome,
    VersionNotFound,
)
from webapp.web.view_models import (
    ChatItem,
    ReplyView,
    UserView,
    annotate,
    items_from_segments,
    render_replies,
    title_from_text,
)


@dataclass(frozen=True)
class Conversation:
    """What a chat page shows: the shown path plus the live run not yet stored."""

    chat: Chat
    items: list[ChatItem]
    live: RunState | None
    earlier: str | None = None  # the first run shown, when older ones exist: the next page


NO_FILES = Taken()  # a message without attachments
PAGE_RUNS = 25  # runs per page of a chat: about 50 messages


class ChatService:
    def __init__(
        self, *, store: ChatStore, session: Session, checkpointer: Checkpointer, runs: RunManager
    ) -> None:
        self.store = store
        self.session = session  # the same file's: the store moves its segments between versions
        self.checkpointer = checkpointer
        self.runs = runs
        self._new_chat_lock = asyncio.Lock()

    # --- reads -------------------------------------------------------------------------

    async def get(self, owner: Owner, chat_id: str) -> Chat | None:
        return await self.store.get(owner, chat_id)

    async def recent(self, owner: Owner, limit: int = 200) -> list[Chat]:
        return await self.store.recent(owner, limit)

    async def follow(self, owner: Owner, chat_id: str, run_id: str) -> RunState | None:
        """Run ``run_id`` of the owner's chat live, here or in another process."""
        if owner.user_id is not None and await self.store.get(owner, chat_id) is None:
            return None  # without accounts every chat is the one user's: nothing to look up
        return await self.runs.follow(chat_id, run_id)

    async def conversation(
        self,
        owner: Owner,
        chat: Chat,
        *,
        before: str | None = None,
        limit: int | None = PAGE_RUNS,
        read: Page | None = None,
    ) -> Conversation | None:
        """The chat as its page shows it: the last ``limit`` runs of the shown path (all
        for None) before run ``before`` (the end for None, with the live run), with their
        version switchers. None when ``before`` is not on the path. ``read``: that
        latest page, already read with the live run (`Started.page`)."""
        live = await self.runs.live(chat) if before is None else None
        if live is not None and (live.abandoned or live.discarded):
            live = None
        also = [live.run_id] if live is not None else []
        page = read if before is None and limit == PAGE_RUNS else None
        if page is None or live is None or live.run_id not in page.tree.nodes:
            page = await self.store.page(
                owner,
                chat.id,
                before=before,
                limit=limit if limit is not None else 1 << 62,
                also=also,
            )
        if page is None:
            return None
        segments = page.segments
        shown = [page.tree.nodes[s.run_id] for s in segments if s.run_id in page.tree.nodes]
        if live is not None and live.run_id in page.tree.nodes:
            shown.append(page.tree.nodes[live.run_id])
        versions = page.tree.versions(shown)
        items = items_from_segments(segments, versions)
        await self._mark_decisions(chat.id, items)
        await render_replies(items)
        earlier = segments[0].run_id if page.earlier and segments else None
        if before is not None:  # an older page: its last reply is not the chat's last
            for item in items:
                if isinstance(item, ReplyView):
                    item.last = False
        stored = {s.run_id for s in segments}
        if live is None or live.run_id in stored:
            return Conversation(chat, items, None, earlier)
        if live.finished and chat.active_run_id != live.run_id:
            return Conversation(chat, items, None, earlier)
        if live.continues is not None:  # its reply streams in place of the stored one
            annotate(live.reply, versions)  # its run_id is the reply it continues
            kept = [
                i for i in items if not (isinstance(i, ReplyView) and i.run_id == live.continues)
            ]
            return Conversation(chat, kept, live, earlier)
        for item in items:  # the live reply comes after them all
            if isinstance(item, ReplyView):
                item.last = False
        annotate(live.reply, versions)
        user = UserView(
            live.run_id,
            live.input_text,
            versions.of_message(live.run_id),
            attachments=live.input_attachments,
        )
        return Conversation(chat, [*items, user], live, earlier)

    async def _mark_decisions(self, chat_id: str, items: list[ChatItem]) -> None:
        """The stored replies' tool cards say what the user decided where one asked."""
        shown = [i for i in items if isinstance(i, ReplyView) and i.tools]
        if not shown:
            return
        decided = await self.store.approvals.of_chat(chat_id)
        anywhere = {c: d for calls in decided.values() for c, d in calls.items()}
        for reply in shown:  # a continuation's decisions are under its own run id
            reply.mark_approvals({**anywhere, **decided.get(reply.run_id, {})})

    # --- starting runs -------------------------------------------------------------------

    async def new_chat(self, owner: Owner) -> Chat:
        return await self.store.create(owner)

    async def start_chat(
        self,
        owner: Owner,
        text: str,
        client_id: str | None,
        settings: ChatSettings | None = None,
        taken: Taken = NO_FILES,
    ) -> NewChatOutcome:
        """A new chat with its first message (the empty home page's composer), and with
        ``settings`` (a preset or a model chosen there) from its first run on."""
        # Two posts of one client id (to any process): the second finds the first.
        async with self._new_chat_lock, self.runs.across_processes(f"new:{client_id}"):
            if client_id is not None:
                found = await self.store.find_send(owner, client_id)
                chat = await self.store.get(owner, found[0]) if found is not None else None
                if chat is not None:
                    return AlreadySent(chat)
            try:
                await self.store.admits(owner)  # over a limit: not even the chat is made
            except LimitReached as reached:
                return OverLimit(None, reached)
            chat = await self.store.create(owner)
            if settings is not None:
                await self.store.settings.apply(chat.id, settings)
            new = _with(NewRun(new_run_id(), client_id=client_id, owner=owner), taken)
            async with self.runs.lock(chat.id):  # a new chat: only a limit can refuse its run
                try:
                    return await self._start(chat.id, text, new)
                except LimitReached as reached:  # another process started one meanwhile
                    await self.store.delete(owner, chat.id, [])
                    return OverLimit(None, reached)

    async def send(
        self,
        owner: Owner,
        chat_id: str,
        text: str,
        client_id: str | None,
        taken: Taken = NO_FILES,
    ) -> SendOutcome:
        """A message (with the files ``taken`` from its uploads) and its reply."""
        async with self.runs.lock(chat_id):
            await self.runs.settle(chat_id)
            # The run's record is the check: it refuses a client id sent before, a chat
            # with a run active, a chat that is not there (or not the owner's) and a
            # send over the owner's limits, writing nothing.
            new = _with(NewRun(new_run_id(), client_id=client_id, owner=owner), taken)
            try:
                return await self._start(chat_id, text, new)
            except (AlreadySentError, ChatBusyError, LimitReached) as refused:
                chat = await self.store.get(owner, chat_id)
                if chat is None:
                    return ChatNotFound()
                if isinstance(refused, LimitReached):
                    return OverLimit(chat, refused)
                return AlreadySent(chat) if isinstance(refused, AlreadySentError) else Busy(chat)

    async def edit(
        self,
        owner: Owner,
        chat_id: str,
        run_id: str,
        text: str,
        keep: frozenset[str] | None = None,
        added: Sequence[NewFile] = (),
        intake: Intake | None = None,
    ) -> EditOutcome:
        """A new version of the user message whose run is ``run_id`` (SPEC §7), with the
        files of the message whose names are in ``keep`` (all with None) and ``added``."""
        async with self._idle(owner, chat_id) as chat:
            if not isinstance(chat, Chat):
                return chat
            segments = await self.session.segments(chat_id)
            index = _input_index(segments, run_id)
            if index is None:
                return MessageNotFound(chat)
            first = segments[index].entries[0]
            rename = None
            if (
                index == 0
                and isinstance(first, UserEntry)
                and chat.title == title_from_text(first.text)
            ):
                rename = title_from_text(text)  # the title was made from it: follow the edit
            new = NewRun(new_run_id(), "edit", target=run_id, rename=rename, owner=owner)
            had = first.attachments if isinstance(first, UserEntry) else ()
            kept = [a for a in had if keep is None or a.name in keep]
            if intake is not None and (kept or added):
                new = _with(new, await intake.combine(kept, added))
            return await self._start_in(chat, text, new)

    async def regenerate(
        self, owner: Owner, chat_id: str, run_id: str | None = None
    ) -> RegenerateOutcome:
        """A new version of the reply of run ``run_id`` (the last reply when None)."""
        async with self._idle(owner, chat_id) as chat:
            if not isinstance(chat, Chat):
                return chat
            segments = await self.session.segments(chat_id)
            if run_id is None and segments:
                run_id = segments[-1].run_id
            elif run_id is not None and not any(s.run_id == run_id for s in segments):
                return MessageNotFound(chat)  # not shown (another version): as for an edit
            index = _input_index(segments, run_id) if run_id is not None else None
            if index is None or run_id is None:
                return NothingToRegenerate(chat)
            first = segments[index].entries[0]
            text = first.text if isinstance(first, UserEntry) else ""
            attached = first.attachments if isinstance(first, UserEntry) else ()
            regenerated = NewRun(
                new_run_id(), "regenerate", target=run_id, owner=owner, attachments=attached
            )
            return await self._start_in(chat, text, regenerated)

    async def continue_reply(self, owner: Owner, chat_id: str, run_id: str) -> ContinueOutcome:
        """Run the model again on a stopped or cut-short last reply; its text joins it."""
        async with self._idle(owner, chat_id) as chat:
            if not isinstance(chat, Chat):
                return chat
            segments = await self.session.segments(chat_id)
            if not any(s.run_id == run_id for s in segments):
                return RunNotFound(chat)
            replies = [i for i in items_from_segments(segments[-1:]) if isinstance(i, ReplyView)]
            if segments[-1].run_id != run_id or not replies or not replies[0].can_continue:
                return CannotContinue(chat)
            new = NewRun(new_run_id(), "continue", target=run_id, owner=owner)
            try:
                state, begun = await self.runs.start(
                    chat.id, new, "", continues=replies[0], page=PAGE_RUNS
                )
            except ChatBusyError:
                return Busy(chat)
            except LimitReached as reached:
                return OverLimit(chat, reached)
            return Started(begun.chat, state, begun.page)

    @contextlib.asynccontextmanager
    async def _idle(self, owner: Owner, chat_id: str) -> AsyncIterator[Chat | ChatNotFound | Busy]:
        """The chat's lock, held for the block, and the chat -- or why it cannot change
        now: it does not exist (or is not the owner's), or a run is active in it."""
        async with self.runs.lock(chat_id):
            chat = await self._settled(owner, chat_id)
            if chat is None:
                yield ChatNotFound()
            elif chat.active_run_id:
                yield Busy(chat)
            else:
                yield chat

    async def _settled(self, owner: Owner, chat_id: str) -> Chat | None:
        """The chat as durable state says, after finishing the bookkeeping of a run
        that ended a moment ago (chat lock held): such a run must not answer 409."""
        await self.runs.settle(chat_id)
        return await self.store.get(owner, chat_id)

    async def _start(self, chat_id: str, text: str, new: NewRun) -> Started:
        """Start ``new`` from ``text`` (chat lock held); raises what `ChatStore.begin_run`
        raises. A chat with no title yet takes one from the text."""
        # A message of files alone is titled by their names.
        named = text if text.strip() else ", ".join(a.name for a in new.attachments)
        new = replace(new, title=title_from_text(named))
        state, begun = await self.runs.start(chat_id, new, text, page=PAGE_RUNS)
        return Started(begun.chat, state, begun.page)

    async def _start_in(self, chat: Chat, text: str, new: NewRun) -> Started | Busy | OverLimit:
        try:
            return await self._start(chat.id, text, new)
        except ChatBusyError:  # the database says a run began first (another process)
            return Busy(chat)
        except LimitReached as reached:
            return OverLimit(chat, reached)

    # --- versions ----------------------------------------------------------------------

    async def switch(self, owner: Owner, chat_id: str, run_id: str) -> SwitchOutcome:
        """Show version ``run_id`` of a message or reply on the shown path (no model call)."""
        async with self._idle(owner, chat_id) as chat:
            if not isinstance(chat, Chat):
                return chat
            tree = await self.store.tree(owner, chat_id)
            node = tree.nodes.get(run_id)
            shown = {n.run_id for n in tree.path()}
            if node is None or (node.parent_run_id is not None and node.parent_run_id not in shown):
                return VersionNotFound(chat)
            if run_id not in shown:
                await self.store.switch(owner, chat_id, run_id)
            return Switched(chat)

    async def branch(self, owner: Owner, chat_id: str, run_id: str) -> BranchOutcome:
        """A new chat with the shown path up to and including reply ``run_id``."""
        async with self._idle(owner, chat_id) as chat:
            if not isinstance(chat, Chat):
                return chat
            segments = await self.session.segments(chat_id)
            if not any(s.run_id == run_id for s in segments):
                return RunNotFound(chat)
            # The original's title is cut to make room: a branch of a branch of a long
            # title stays within the limit, so it can be renamed and exported back.
            title = shortened_title(chat.display_title, " (branch)")
            branched = await self.store.branch(owner, chat_id, run_id, title)
            return Branched(branched) if branched is not None else ChatNotFound()

    # --- files and search ------------------------------------------------------------------

    async def export(self, owner: Owner, chat_id: str) -> ChatFile | None:
        return await self.store.export(owner, chat_id)

    async def import_chat(
        self, owner: Owner, data: bytes, *, max_message_chars: int, intake: Intake | None = None
    ) -> Imported | BadChatFile:
        """A new chat from an exported JSON file; nothing is written unless all of it is
        valid. Reading 10 MB of JSON takes a second or more: it runs in a worker thread,
        so the server goes on answering everyone else meanwhile."""
        try:
            parsed = await asyncio.to_thread(
                file_format.parse, data, max_message_chars=max_message_chars
            )
        except ChatFileError as exc:
            return BadChatFile(str(exc))
        files: list[NewFile] = []
        if parsed.files and intake is not None:
            try:  # under the limits of an upload, each file on its own
                for file in parsed.files:
                    files += await intake.read([Upload(file.name, file.data)])
            except AttachmentRefused as exc:
                return BadChatFile(str(exc))
        elif parsed.files:
            return BadChatFile("this app takes no attached files")
        chat = await self.store.get(owner, await self.store.import_chat(owner, parsed, files))
        if chat is None:
            raise RuntimeError("an imported chat vanished before it could be shown")
        return Imported(chat)

    async def search(self, owner: Owner, text: str) -> list[SearchHit]:
        """Chats whose messages match, then those whose attached documents do (§14)."""
        hits = await self.store.search(owner, text)
        found = {h.chat_id for h in hits}
        in_files = [h for h in await self.store.files.search(owner, text) if h.chat_id not in found]
        return hits + in_files

    # --- stop, rename, delete --------------------------------------------------------------

    async def stop(self, owner: Owner, chat_id: str, run_id: str) -> StopOutcome:
        """SPEC §6 flow 2; stopping a run that already ended shows it as it ended.
        A run another process executes is stopped by that process: this one asks and
        waits (without the chat's lock, which that process needs to record the stop)."""
        async with self.runs.lock(chat_id):
            chat = await self.store.get(owner, chat_id)
            if chat is None:
                return ChatNotFound()
            state = self.runs.get(run_id)
            # A run waiting for a tool approval has no task: it is stopped from its
            # checkpoint, as one a crash left (`stop_unowned`).
            if (
                state is not None
                and state.chat_id == chat_id
                and not (state.abandoned or state.paused)
            ):
                await self.runs.stop(state)
                position = None if state.finished else state.position
                await render_replies([state.reply])
                return ShownReply(chat, state.reply, position)
            elsewhere = chat.active_run_id == run_id and not await self.runs.stop_unowned(
                chat, run_id
            )
        if elsewhere:
            await self.runs.wait_ended(chat_id, run_id)
        return await self.stored_reply(owner, chat_id, run_id)

    # --- tool approvals (SPEC §11) --------------------------------------------------------

    async def decide(
        self, owner: Owner, chat_id: str, run_id: str, call_id: str, decision: Decision
    ) -> DecideOutcome:
        """Allow, Always allow or Deny on a call that waits: recorded, and the run resumed
        once however often it is asked (`Pauses.decide`). Answers with the reply as it
        now stands: streaming on, or as it was when the call no longer waited."""
        async with self.runs.lock(chat_id):
            chat = await self._settled(owner, chat_id)
            if chat is None:
                return ChatNotFound()
            state = await self.runs.pauses.decide(chat, run_id, call_id, decision)
            if state is not None:
                return ShownReply(chat, state.reply, None if state.finished else state.position)
        return await self.current_reply(owner, chat_id, run_id)

    async def current_reply(self, owner: Owner, chat_id: str, run_id: str) -> StopOutcome:
        """Run ``run_id``'s reply as it is now: live (here or elsewhere), waiting, or stored."""
        chat = await self.store.get(owner, chat_id)
        if chat is not None and chat.active_run_id == run_id:
            live = await self.runs.live(chat)
            if live is not None and live.run_id == run_id:
                await render_replies([live.reply])
                return ShownReply(chat, live.reply, None if live.finished else live.position)
        return await self.stored_reply(owner, chat_id, run_id)

    async def stored_reply(self, owner: Owner, chat_id: str, run_id: str) -> StopOutcome:
        """The stored reply of one run (a read: no lock, no change)."""
        chat = await self.store.get(owner, chat_id)
        if chat is None:
            return ChatNotFound()
        # The run's own row, not the chat read until it turns up: an id that is not
        # there costs the same few reads in a chat of any length.
        found = await self.store.shown_run(owner, chat_id, run_id)
        node = found.tree.nodes.get(run_id) if found is not None else None
        if found is None or node is None:
            waiting = await self.runs.pauses.shown(chat) if chat.active_run_id == run_id else None
            if waiting is None:
                return RunNotFound(chat)
            await render_replies([waiting.reply])
            return ShownReply(chat, waiting.reply, None)  # stored in its checkpoint, waiting
        items = items_from_segments([found.segment], found.tree.versions([node]))
        reply = next((i for i in items if isinstance(i, ReplyView)), None)
        if reply is None:
            return RunNotFound(chat)
        # While a run is active its reply comes after this one, as on the page.
        reply.last = found.last and chat.active_run_id is None
        await render_replies([reply])
        return ShownReply(chat, reply, None)

    async def rename(self, owner: Owner, chat_id: str, title: str) -> RenameOutcome:
        """An empty title restores the automatic one (from the first message)."""
        async with self.runs.lock(chat_id):
            chat = await self.store.get(owner, chat_id)
            if chat is None:
                return ChatNotFound()
            if not title:
                segments = await self.session.segments(chat_id)
                first = segments[0].entries[0] if segments and segments[0].entries else None
                live = self.runs.latest(chat_id)
                text = first.text if isinstance(first, UserEntry) else None
                if text is None and live is not None and (not live.finished or live.paused):
                    text = live.input_text  # the first message's reply is still streaming
                title = title_from_text(text) if text else ""
            await self.store.rename(owner, chat_id, title)
            renamed = await self.store.get(owner, chat_id)
            return Renamed(renamed or chat)

    async def delete(self, owner: Owner, chat_id: str) -> DeleteOutcome:
        """Cancel the chat's run, then remove the chat with everything it holds. A run
        another process executes is stopped there first (waited for without the lock)."""
        while True:
            async with self.runs.lock(chat_id):
                chat = await self.store.get(owner, chat_id)
                if chat is None:
                    return ChatNotFound()
                live = self.runs.latest(chat_id)
                active = chat.active_run_id
                elsewhere = None
                if live is not None:
                    await self.runs.discard(live)
                here = live is not None and live.run_id == active and not live.abandoned
                if active and not here and not await self.runs.stop_unowned(chat, active):
                    elsewhere = active
                if elsewhere is None:
                    run_ids = {s.run_id for s in await self.session.segments(chat_id)}
                    run_ids.update(r for r in (active, live and live.run_id) if r)
                    await self.store.delete(owner, chat_id, sorted(run_ids))
                    self.runs.forget_chat(chat_id)
                    return Deleted(chat_id)
            await self.runs.wait_ended(chat_id, elsewhere)


def _input_index(segments: list[Segment], run_id: str) -> int | None:
    """The index of ``run_id``'s segment if it starts with its user message."""
    for index, seg in enumerate(segments):
        if seg.run_id == run_id:
            if seg.entries and isinstance(seg.entries[0], UserEntry):
                return index
            return None
    return None


def _with(new: NewRun, taken: Taken) -> NewRun:
    """``new`` bringing the message's files."""
    if not taken.attachments:
        return new
    return replace(new, attachments=taken.attachments, files=taken.files)
