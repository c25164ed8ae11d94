"""Keeps this process's run leases, and takes over runs no live process holds.

Only with other processes on PostgreSQL (`webapp.stores.postgres_cluster`). One
task per process wakes every `LeaseTimes.renew` seconds, or at once when another
process hands its runs over, and in turn:
1. renews the leases of the runs this process executes; a run whose lease is
   gone (another process took it after this one stalled) is given up without
   recording anything, and a run another process asked to stop is stopped;
2. takes over every run still owed that no live lease covers (`LeaseHolder.recover`);
3. brings the runs this process follows up to date (they are also woken by
   notifications, but never depend on one).
If renewals kept failing (or this process stalled) for most of a lease's
length, every run here is given up before its lease can expire: another
process may take it over any moment, and two must never run it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

from webapp.stores.cluster import Cluster
from webapp.web.live.host import LeaseHolder

logger = logging.getLogger("webapp.web.live.lease_keeper")


class LeaseKeeper:
    def __init__(self, runs: LeaseHolder, cluster: Cluster) -> None:
        self.runs = runs
        self.cluster = cluster
        self._task: asyncio.Task[None] | None = None
        self._scan_now = asyncio.Event()
        self._started = False

    async def start(self) -> None:
        """Open the cluster's connections, resume what nobody holds, and keep at it."""
        await self.cluster.start()
        self._started = True
        self.cluster.on_events = self.runs.wake_followers
        self.cluster.on_stop = self.runs.stop_asked
        self.cluster.on_handover = self._scan_now.set
        await self.runs.recover()
        self._task = asyncio.get_running_loop().create_task(self._tend(), name="lease-keeper")

    async def stop(self) -> None:
        """Stop tending (before the runs are interrupted)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def hand_over(self) -> None:
        """After the runs here were interrupted: give their leases up and wake the others."""
        if not self._started:  # start failed before the connections were open
            await self.cluster.close()
            return
        try:
            handed = await self.cluster.hand_over()
            if handed:
                logger.info("handed %d runs over to the other processes", handed)
        finally:
            await self.cluster.close()

    async def _tend(self) -> None:
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        ticks = itertools.count()
        lease = self.cluster.lease
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._scan_now.wait(), lease.renew)
            self._scan_now.clear()
            if loop.time() - renewed > lease.seconds - 2 * lease.renew:
                self._give_up_all()  # this process stalled: another may take its runs any moment
            try:
                await self._renew()
                renewed = loop.time()
                await self.runs.recover()
                await self.runs.poll_followers(loop.time())
                if next(ticks) % 30 == 29:
                    await self.cluster.keep_listening()
                    await self.cluster.forget_old_events()
            except Exception:
                logger.exception("could not tend the run leases")

    def _give_up_all(self) -> None:
        for state in self.runs.owned().values():
            self.runs.give_up(state)

    async def _renew(self) -> None:
        owned = self.runs.owned()
        held, stops = await self.cluster.renew({r: state.epoch for r, state in owned.items()})
        for run_id, state in owned.items():
            if run_id not in held:
                logger.warning("run %s: its lease was lost; another process resumes it", run_id)
                self.runs.give_up(state)
            elif run_id in stops:
                self.runs.stop_asked(run_id)
