"""A run that cannot make progress fails, naming the jobs that wait: it never hangs.

SeaWorker's own waits (a job waiting for a process, for its directory to settle home, for the job
with its checksum to end) are woken by events only: a job's process returning, a prefetch copy
landing, a copy home committing. While Sea waits for jobs, no job is in a process, no copy is on
its way and nothing happened for :data:`STALL_AFTER` seconds, nothing ever will: each wait fails
with :class:`SeaStalled`, one line naming the jobs by task and node, and Pydra ends the run with
that error (its processes shut down with the Submitter).

>>> import asyncio
>>> async def demo():
...     stuck = asyncio.get_running_loop().create_future()
...     dog = Watchdog(lambda: {"Add:add2": [stuck]}, busy=lambda: False, after=0.05)
...     dog.start()
...     try:
...         await stuck
...     except SeaStalled as error:
...         print(error)
>>> asyncio.run(demo())  # doctest: +ELLIPSIS
the run cannot make progress: 1 job(s) of Sea's worker waits (Add:add2) while no job runs and nothing moves home, ...
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import typing as ty

from sea.console import SeaError

logger = logging.getLogger("sea")

STALL_AFTER = 60.0  # seconds with Sea waiting, nothing running and nothing moving


class SeaStalled(SeaError, RuntimeError):
    """Sea's worker waits for something no job, copy or process can bring any more (a defect of Sea's;
    the message names the jobs)."""


class Watchdog:
    """``waiting()``: the jobs Sea waits for, by name, each with the futures their waits are on;
    ``busy()``: something outside the event loop will bring an event (a copy home under way).
    :meth:`running` marks the rest (a job in a process, a prefetch copy awaited)."""

    def __init__(self, waiting: ty.Callable[[], dict[str, list[asyncio.Future]]], busy: ty.Callable[[], bool], after: float | None = None):
        self._waiting, self._busy, self._after = waiting, busy, STALL_AFTER if after is None else after
        self._running = 0
        self._last = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._last = time.monotonic()
        self._schedule()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @contextlib.contextmanager
    def running(self):
        """Something under way that ends with an event (a job in a process)."""
        self._running += 1
        self.event()
        try:
            yield
        finally:
            self._running -= 1
            self.event()

    def event(self) -> None:
        self._last = time.monotonic()

    def _schedule(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(max(self._after / 4, 0.01), self._check)

    def _check(self) -> None:
        waiting = {name: [f for f in futures if not f.done()] for name, futures in self._waiting().items()}
        waiting = {name: futures for name, futures in waiting.items() if futures}
        if not waiting or self._running or self._busy():
            self.event()
        elif time.monotonic() - self._last >= self._after:
            names = sorted(waiting)
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            error = SeaStalled(
                f"the run cannot make progress: {len(names)} job(s) of Sea's worker waits ({shown}) while no job runs and "
                f"nothing moves home, a defect of Sea's: please report it with this line; rerun to resume, or use worker='cf'"
            )
            logger.error("[Sea] %s", error)
            for futures in waiting.values():
                for future in futures:
                    future.set_exception(error)
            self._timer = None
            return
        self._schedule()
