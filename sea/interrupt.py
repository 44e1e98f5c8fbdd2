"""Ctrl-C, SIGTERM and SIGHUP end a run the same way, and the adapters can tell that one did.

A batch system stops a job at its time limit with SIGTERM, then SIGKILL some seconds later (SLURM:
``KillWait``, 30 s by default); a terminal that closes sends SIGHUP. Python's default for both is to
die on the spot, leaving copies half-written (the declared outputs not home); as
``KeyboardInterrupt`` it unwinds through the adapters, which stop the running nodes and let the
engine commit the flushes already under way (``SeaEngine.close(interrupted=True)``). A signal the
run was started ignoring (``nohup``'s SIGHUP) stays ignored.

The signal reaches the worker processes too (a terminal and SLURM signal the whole process group);
one of them dying can end the run with the engine's own error (Nipype: ``BrokenProcessPool``)
before the main thread's handler has run, so the handler also records the signal (``received``).
``quiet()`` stops it from raising while the adapter winds down, so a second Ctrl-C cannot cut the
final flushes short. Only the main thread can install handlers; elsewhere this does nothing.

A KeyboardInterrupt raised by a signal handler surfaces wherever the main thread happens to be,
including inside the standard library's own critical sections: seen in Pydra's event loop, raised
between ``ProcessPoolExecutor.submit`` taking a queue's lock and releasing it, which left the
executor's thread waiting for that lock forever and the process unable to exit. A run driven by
an asyncio event loop therefore has the loop raise it, between two callbacks (:func:`raise_in_loop`);
Nipype's scheduling loop, at the start of a round (:class:`StopRequest`).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal the run was started from closed
RESENT = (signal.SIGTERM, signal.SIGHUP)  # the process ends on them once wound down, as under the engine's own plugin


class StopSignals:
    """``with StopSignals() as stop:`` or ``install()``/``quiet()``/``restore()`` (idempotent)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._raising = True
        self._stop: Callable[[int], None] | None = None

    def install(self, stop: Callable[[int], None] | None = None) -> StopSignals:
        """``stop(signum)``: what a stop signal does instead of raising KeyboardInterrupt on the spot."""
        if not self._previous and threading.current_thread() is threading.main_thread():
            self.received, self._raising, self._stop = None, True, stop
            # one ignored stays ignored (nohup's SIGHUP, a background job's SIGINT)
            self._previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}
        return self

    def quiet(self) -> None:
        """From now on a stop signal is only recorded."""
        self._raising = False

    def restore(self, resend: bool = True) -> None:
        """The handlers as they were. After a SIGTERM, the run wound down (its copies committed): the
        signal is delivered again, to them, so that a process nothing else catches it in ends as it
        ends under the engine's own plugin, on the signal (exit status 143), with no traceback
        (``resend=False``: the caller has more to wind down first, then calls :meth:`resend`)."""
        if not self._previous:
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
        if resend:
            self.resend()

    def resend(self) -> None:
        """After :meth:`restore`: a SIGTERM (or SIGHUP) received is delivered again (see there)."""
        if self.received in RESENT and not self._previous:
            signal.raise_signal(self.received)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.received = signum
        if self._raising and self._stop is not None:
            self._stop(signum)
        elif self._raising:
            raise_stop(signum)

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()


def die_on_terminate() -> None:
    """In a worker process the adapter's pool starts: SIGTERM kills it, as by default. Forked after
    the run installed its handlers, it would inherit one that only wakes the run's loop (in the
    parent), and go on running its job: a pool that lost a process to the OOM killer terminates the
    others, whose nodes run again in directories such a survivor would still write into."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    die_with_parent()


def die_with_parent() -> None:
    """In a worker process: the kernel kills it when the process that started it dies (``kill -9``
    of the run, which cannot stop its pool): an orphaned worker would go on running its node, and
    stay (Linux's ``PR_SET_PDEATHSIG``; elsewhere nothing). The pool starts its processes from the
    thread that drives the run, which lives as long as the run."""
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the run died before this process asked
        os._exit(1)


PR_SET_PDEATHSIG = 1


def raise_stop(signum: int) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")


class StopRequest:
    """A ``stop`` for :meth:`StopSignals.install` in a run driven by a loop of its own (Nipype's):
    the signal is noted and the loop woken; the loop calls :meth:`raise_if_requested` once per
    round, where raising leaves nothing half-done."""

    def __init__(self, wake: Callable[[], None]):
        self.signum: int | None = None
        self._wake = wake

    def __call__(self, signum: int) -> None:
        self.signum = signum
        self._wake()

    def raise_if_requested(self) -> None:
        if self.signum is not None:
            raise_stop(self.signum)


def raise_in_loop(loop) -> Callable[[int], None]:
    """A ``stop`` for :meth:`StopSignals.install` that has the asyncio event ``loop`` raise the
    KeyboardInterrupt from a callback of its own; it leaves ``run_until_complete`` from there."""

    def stop(signum: int) -> None:
        try:
            loop.call_soon_threadsafe(raise_stop, signum)  # a deque append and a byte to the loop's wake-up pipe
        except RuntimeError:  # the loop is closed: the run is over
            pass

    return stop


def stop_process_pool(pool) -> None:
    """Stop a ``concurrent.futures.ProcessPoolExecutor`` now and wait until its processes are gone.

    After an interrupt the engine drops the directories of the nodes that were running; a worker
    process still finishing its node (a SIGTERM sent to the main process only) or saving its crash
    record would write into them again. Terminating the workers and waiting closes that window.
    """
    processes = list((getattr(pool, "_processes", None) or {}).values())  # the executor's own record
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():  # stuck on a queue lock a killed sibling held: it cannot finish
            process.kill()
            process.join(timeout=5)
    # A worker stopped while sending its result left half a message in the result pipe; the
    # executor's manager thread waits for the rest, and the interpreter joins that thread at exit:
    # the process would never end. With every worker gone, the parent's own write end is the last
    # one: closing it turns the wait into an end of file, which the thread handles as a broken pool.
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    if writer is not None and not any(process.is_alive() for process in processes):
        writer.close()
