"""The live-run core's small parts: a run's phase, the process-local cluster, the lease time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from webhelpers import cli_env

from webapp.chats.store import EVERY_CHAT, ChatStore, NewRun
from webapp.stores.cluster import LeaseTimes
from webapp.web.live.local_cluster import LocalCluster
from webapp.web.live.reply import ReplyView
from webapp.web.live.run_state import Ending, Phase, RunState, Stage


def test_a_weightier_reason_to_end_stays():
    phase = Phase()
    phase.end_for(Ending.STOP)
    assert phase.ending is Ending.STOP
    phase.end_for(Ending.LEASE_LOST)  # taken over elsewhere: record nothing, stop or not
    assert phase.ending is Ending.LEASE_LOST
    phase.end_for(Ending.STOP)  # a stop asked after that changes nothing
    assert phase.ending is Ending.LEASE_LOST
    phase.end_for(Ending.DISCARD)  # the chat is being deleted: nothing at all
    phase.end_for(Ending.LEASE_LOST)
    assert phase.ending is Ending.DISCARD
    assert phase.stage is Stage.RUNNING


async def test_a_run_states_flags_read_its_phase():
    state = RunState("c", "r", "e.1", "hi", ReplyView("r"))
    assert not (state.finished or state.abandoned or state.stop_requested)
    state.phase.end_for(Ending.STOP)
    assert state.stop_requested and not state.finished
    state.phase.end_for(Ending.LEASE_LOST)
    state.phase.abandon()
    assert state.finished and state.abandoned and state.lease_lost and not state.stop_requested
    other = RunState("c", "r2", "e.2", "hi", ReplyView("r2"))
    other.phase.end_for(Ending.DISCARD)
    other.phase.finish()
    assert other.finished and other.discarded and not other.abandoned


async def test_the_local_cluster_owes_active_runs_but_not_those_waiting_for_a_decision(
    tmp_path: Path,
):
    store = ChatStore(tmp_path / "chat.db")
    try:
        running = await store.create(EVERY_CHAT, "running")
        waiting = await store.create(EVERY_CHAT, "waiting")
        await store.create(EVERY_CHAT, "idle")
        await store.begin_run(running.id, NewRun("a" * 32, input="hi", owner=EVERY_CHAT))
        await store.begin_run(waiting.id, NewRun("b" * 32, input="hi", owner=EVERY_CHAT))
        await store.approvals.pause(waiting.id, "b" * 32, [])
        cluster = LocalCluster(store)
        assert await cluster.unowned() == [(running.id, "a" * 32)]
        # Alone, nobody else can hold a run: every claim is this process's.
        assert await cluster.claim("a" * 32, running.id, "x.1")
        assert await cluster.lease_epoch("a" * 32) is None  # nothing to follow elsewhere
        assert await cluster.renew({"a" * 32: "x.1"}) == ({"a" * 32}, set())
    finally:
        await store.close()


def test_the_lease_time_is_a_setting_renewed_every_fifth_of_it():
    assert LeaseTimes().seconds == 10.0 and LeaseTimes().renew == 2.0
    assert LeaseTimes(3.0).renew == pytest.approx(0.6)
    with pytest.raises(ValueError, match="at least 1 second"):
        LeaseTimes(0.5)


def test_a_lease_time_below_a_second_is_refused_by_the_cli(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "webapp", "--db", str(tmp_path / "c.db"), "--lease-seconds", "0"],
        check=False,
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
    )
    assert done.returncode == 2
    assert "--lease-seconds: must be a number of seconds, at least 1" in done.stderr
