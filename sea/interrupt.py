"""SIGTERM ends a run the way Ctrl-C does.

A batch system stops a job at its time limit with SIGTERM, then SIGKILL some seconds later (SLURM:
``KillWait``, 30 s by default). Python's default for SIGTERM is to die on the spot, leaving copies
half-written; as ``KeyboardInterrupt`` it unwinds through the adapters, which stop the running
nodes and let the engine commit the flushes already under way (``SeaEngine.close(interrupted=True)``).
Only the main thread can install a handler; elsewhere this does nothing.
"""

from __future__ import annotations

import signal
import threading


class TerminateAsInterrupt:
    """Install with ``with TerminateAsInterrupt():`` or ``install()``/``restore()`` (idempotent)."""

    def __init__(self) -> None:
        self._previous: object | None = None
        self._installed = False

    def install(self) -> TerminateAsInterrupt:
        if not self._installed and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, _raise_interrupt)
            self._installed = True
        return self

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False

    def __enter__(self) -> TerminateAsInterrupt:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")


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
        process.join(timeout=30)
