"""A chat is a tree of runs; the session holds the one path on screen (SPEC §7).

Every run the chat ever had is a node of ``chat_runs``: its parent is the run
before it on its path, and ``message_id`` names the version of the user
message it answers (an edit starts a new message, a regenerate a new run of
the same message). Selection is recency: each node carries a ``selected``
stamp, and the shown path takes, under each parent, the message whose newest
stamp is largest and, within it, the run with the largest stamp. So choosing a
version stamps one node, and the versions below it keep their own choice.

Invariants, each named for the failure it prevents:
- a run on the shown path lives in the session and nowhere else; a run off it
  keeps its segment here (``entries_json``). Moving between the two happens in
  one transaction with the selection change, so a crash can neither lose a
  version nor show one twice;
- the session is exactly the shown path, so the model never sees a version
  that is not on screen;
- a cut is always at a segment boundary: versions replace whole runs.

The functions here work inside a transaction of `ChatStore` (one SQLite file,
one connection) and never commit themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from webapp.chats.db import Tx
from webapp.chats.session_rows import (
    append_segments,
    cut_segments,
    stored_segments,
)
from webapp.stores.codec import StoredSegment
from webapp.transcript import AssistantEntry, Entry
from webapp.usage import Usage

SCHEMA = """
CREATE TABLE IF NOT EXISTS chat_runs (
    run_id        TEXT    PRIMARY KEY,
    chat_id       TEXT    NOT NULL,
    parent_run_id TEXT,
    message_id    TEXT    NOT NULL,
    seq           INTEGER NOT NULL,
    selected      INTEGER NOT NULL,
    entry_count   INTEGER,
    entries_json  TEXT,
    meta_json     TEXT
);
CREATE INDEX IF NOT EXISTS chat_runs_by_chat ON chat_runs (chat_id, seq);
CREATE INDEX IF NOT EXISTS chat_runs_by_parent ON chat_runs (chat_id, parent_run_id);
"""


@dataclass(frozen=True)
class Node:
    run_id: str
    parent_run_id: str | None
    message_id: str
    seq: int  # creation order in the chat: versions are numbered by it
    selected: int  # selection stamp: the largest is shown
    model: str | None = None  # endpoint/model (`webapp.chats.settings`)
    usage: Usage | None = None  # None: the endpoint reported none (or not finished)


# The columns `_node` reads, in its order.
_NODE_COLUMNS = "run_id, parent_run_id, message_id, seq, selected, model, tokens_in, tokens_out"


def _node(row: Sequence[Any]) -> Node:
    usage = Usage(int(row[6]), int(row[7] or 0)) if row[6] is not None else None
    return Node(str(row[0]), row[1], str(row[2]), int(row[3]), int(row[4]), row[5], usage)


@dataclass(frozen=True)
class Versions:
    """Where a shown message or reply sits among its versions."""

    index: int  # 1-based
    count: int
    previous: str | None  # the run to show for the previous version
    next: str | None
    # A reply's: each version's model, in order (what it shows, not what it is).
    models: tuple[str | None, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class PathVersions:
    """For each run on the shown path, its message's and its reply's versions."""

    messages: dict[str, Versions]
    replies: dict[str, Versions]
    nodes: dict[str, Node] = field(default_factory=dict)  # the path's own, by run id

    def of_message(self, run_id: str) -> Versions | None:
        """The switcher of run ``run_id``'s user message, if it has several versions."""
        return _several(self.messages.get(run_id))

    def of_reply(self, run_id: str) -> Versions | None:
        return _several(self.replies.get(run_id))


def _several(versions: Versions | None) -> Versions | None:
    return versions if versions is not None and versions.count > 1 else None


class Tree:
    """The nodes of one chat, with the shown path and the version switchers."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.nodes = {n.run_id: n for n in nodes}
        self._children: dict[str | None, list[Node]] = {}
        for node in sorted(self.nodes.values(), key=lambda n: n.seq):
            self._children.setdefault(node.parent_run_id, []).append(node)

    def children(self, parent: str | None) -> list[Node]:
        return self._children.get(parent, [])

    def messages_under(self, parent: str | None) -> list[list[Node]]:
        """The message versions under ``parent`` in creation order, each its runs."""
        groups: dict[str, list[Node]] = {}
        for node in self.children(parent):
            groups.setdefault(node.message_id, []).append(node)
        return list(groups.values())

    def chosen(self, parent: str | None) -> Node | None:
        """The run shown under ``parent``: the newest selected message, then run."""
        groups = self.messages_under(parent)
        if not groups:
            return None
        group = max(groups, key=lambda runs: max(r.selected for r in runs))
        return max(group, key=lambda r: r.selected)

    def path(self, start: str | None = None) -> list[Node]:
        """The shown path below ``start`` (the whole chat for None)."""
        out: list[Node] = []
        node = self.chosen(start)
        while node is not None:
            out.append(node)
            node = self.chosen(node.run_id)
        return out

    def versions(self, path: list[Node]) -> PathVersions:
        messages: dict[str, Versions] = {}
        replies: dict[str, Versions] = {}
        for node in path:
            groups = self.messages_under(node.parent_run_id)
            at = next(i for i, g in enumerate(groups) if g[0].message_id == node.message_id)
            shown = [max(g, key=lambda r: r.selected).run_id for g in groups]
            messages[node.run_id] = _versions(shown, at)
            runs = [r.run_id for r in groups[at]]
            models = tuple(r.model for r in groups[at])
            replies[node.run_id] = _versions(runs, runs.index(node.run_id), models)
        return PathVersions(messages, replies, {n.run_id: n for n in path})


def _versions(run_ids: list[str], at: int, models: tuple[str | None, ...] = ()) -> Versions:
    return Versions(
        at + 1,
        len(run_ids),
        run_ids[at - 1] if at > 0 else None,
        run_ids[at + 1] if at + 1 < len(run_ids) else None,
        models,
    )


def continued(entries: list[Entry], produced: list[Entry]) -> list[Entry]:
    """A reply's entries with a continuation's appended: text that goes on from the
    reply's last text joins that entry, so the model and the page see one reply."""
    out, rest = list(entries), list(produced)
    last, first = (out[-1] if out else None), (rest[0] if rest else None)
    if isinstance(last, AssistantEntry) and isinstance(first, AssistantEntry):
        out[-1] = replace(last, text=last.text + first.text)
        rest.pop(0)
    return out + rest


# --- inside a ChatStore transaction ----------------------------------------------------


async def load_tree(tx: Tx, chat_id: str) -> Tree:
    rows = await tx.fetch(f"SELECT {_NODE_COLUMNS} FROM chat_runs WHERE chat_id = ?", (chat_id,))
    return tree_of(rows)


async def load_around(tx: Tx, chat_id: str, run_ids: list[str]) -> Tree:
    """The part of the tree a page of ``run_ids`` needs for its switchers (`around`)."""
    return tree_of(await tx.fetch(*around(chat_id, run_ids))) if run_ids else Tree([])


def tree_of(rows: Iterable[Sequence[Any]]) -> Tree:
    """The tree of rows read with `around`."""
    return Tree(_node(r) for r in rows)


def around(chat_id: str, run_ids: list[str]) -> tuple[str, tuple[str, ...]]:
    """One statement for the runs ``run_ids`` and every run beside them (same parent, or
    both the chat's first): each branch an indexed lookup, so its cost follows the page,
    not the chat, and being one statement it needs no transaction around it."""
    marks = ",".join("?" * len(run_ids))
    columns = _NODE_COLUMNS
    sql = (
        "WITH shown AS (SELECT run_id, parent_run_id FROM chat_runs "
        f"WHERE chat_id = ? AND run_id IN ({marks})) "
        f"SELECT {columns} FROM chat_runs WHERE chat_id = ? "
        "AND run_id IN (SELECT run_id FROM shown) "
        f"UNION SELECT {columns} FROM chat_runs WHERE chat_id = ? "
        "AND parent_run_id IN (SELECT parent_run_id FROM shown) "
        f"UNION SELECT {columns} FROM chat_runs WHERE chat_id = ? AND parent_run_id IS NULL "
        "AND EXISTS (SELECT 1 FROM shown WHERE parent_run_id IS NULL)"
    )
    return sql, (chat_id, *run_ids, chat_id, chat_id, chat_id)


async def numbers(tx: Tx, chat_id: str) -> tuple[int, int]:
    """The next node's creation number and selection stamp (one indexed aggregate)."""
    rows = list(
        await tx.fetch(
            "SELECT COALESCE(MAX(seq), 0) + 1, COALESCE(MAX(selected), 0) + 1 FROM chat_runs "
            "WHERE chat_id = ?",
            (chat_id,),
        )
    )
    return int(rows[0][0]), int(rows[0][1])


async def find(tx: Tx, chat_id: str, run_id: str) -> Node | None:
    rows = await tx.fetch(
        f"SELECT {_NODE_COLUMNS} FROM chat_runs WHERE chat_id = ? AND run_id = ?",
        (chat_id, run_id),
    )
    return _node(rows[0]) if rows else None


async def path_end(tx: Tx, chat_id: str) -> str | None:
    """The last run of the shown path while no run is active: the session's last."""
    rows = list(
        await tx.fetch(
            "SELECT run_id FROM session_segments WHERE session_id = ? ORDER BY seq DESC LIMIT 1",
            (chat_id,),
        )
    )
    return str(rows[0][0]) if rows else None


async def add_node(
    tx: Tx,
    chat_id: str,
    run_id: str,
    parent_run_id: str | None,
    message_id: str,
    at: tuple[int, int] | None = None,
    model: str | None = None,
) -> None:
    """A new run, selected (a new version is shown when it is made); ``at`` gives its
    (seq, selected) when the caller numbers several itself; ``model``, the model it
    runs with."""
    seq, selected = at if at is not None else await numbers(tx, chat_id)
    await tx.execute(
        "INSERT INTO chat_runs (run_id, chat_id, parent_run_id, message_id, seq, selected, "
        "model) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (run_id, chat_id, parent_run_id, message_id, seq, selected, model),
    )


async def archive_from(tx: Tx, chat_id: str, run_id: str) -> list[str]:
    """Take run ``run_id`` and everything after it off the session into the archive;
    returns the run ids taken."""
    taken = await cut_segments(tx, chat_id, run_id)
    await tx.executemany(
        "UPDATE chat_runs SET entry_count = ?, entries_json = ?, meta_json = ? "
        "WHERE chat_id = ? AND run_id = ?",
        [(s.entry_count, s.entries_json, s.meta_json, chat_id, s.run_id) for s in taken],
    )
    return [s.run_id for s in taken]


async def restore(tx: Tx, chat_id: str, run_ids: list[str]) -> None:
    """Append the archived segments of ``run_ids`` to the session, in that order."""
    if not run_ids:
        return
    marks = ",".join("?" * len(run_ids))
    rows = await tx.fetch(
        f"SELECT run_id, entry_count, entries_json, meta_json FROM chat_runs "
        f"WHERE chat_id = ? AND run_id IN ({marks}) AND entries_json IS NOT NULL",
        (chat_id, *run_ids),
    )
    found = {str(r[0]): StoredSegment(str(r[0]), int(r[1]), str(r[2]), r[3]) for r in rows}
    await append_segments(tx, chat_id, [found[r] for r in run_ids if r in found])
    await tx.executemany(
        "UPDATE chat_runs SET entry_count = NULL, entries_json = NULL, meta_json = NULL "
        "WHERE chat_id = ? AND run_id = ?",
        [(chat_id, r) for r in found],
    )


async def select(tx: Tx, chat_id: str, run_id: str) -> None:
    _, selected = await numbers(tx, chat_id)
    await tx.execute(
        "UPDATE chat_runs SET selected = ? WHERE chat_id = ? AND run_id = ?",
        (selected, chat_id, run_id),
    )


async def backfill(tx: Tx, chat_id: str, active_run_id: str | None) -> None:
    """Nodes for a chat stored before versions existed: its session is one path."""
    known = {n for n in (await load_tree(tx, chat_id)).nodes}
    seq, selected = await numbers(tx, chat_id)
    parent: str | None = None
    runs = [s.run_id for s in await stored_segments(tx, chat_id)]
    for run_id in [*runs, *([active_run_id] if active_run_id is not None else [])]:
        if run_id not in known:
            await add_node(tx, chat_id, run_id, parent, run_id, (seq, selected))
            known.add(run_id)
            seq, selected = seq + 1, selected + 1
        parent = run_id


async def backfill_all(tx: Tx) -> int:
    """`backfill` every chat that has runs with no node; returns how many chats."""
    rows = list(
        await tx.fetch(
            "SELECT id, active_run_id, continues_run_id FROM chats WHERE id IN ("
            "SELECT session_id FROM session_segments WHERE run_id NOT IN "
            "(SELECT run_id FROM chat_runs) UNION SELECT id FROM chats WHERE "
            "active_run_id IS NOT NULL AND continues_run_id IS NULL AND active_run_id "
            "NOT IN (SELECT run_id FROM chat_runs))"
        )
    )
    for chat_id, active, continuing in rows:
        await backfill(tx, chat_id, None if continuing else active)
    return len(rows)
