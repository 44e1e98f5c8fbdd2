"""A run's progress as a person follows it: nodes done of the total, what runs now, each fast
tier's fill, what waits to go home and how fast it goes, and an ETA from learned run times.

On a terminal it is one line that updates in place (tqdm), with the engines' own log lines printed
above it; in a log file or a batch job's output, a plain ``[Sea] progress:`` line every
:data:`EVERY` seconds. The engine owns the figures (:class:`Snapshot`); this module only shows them.

>>> snap = Snapshot(elapsed=75, done=12, total=40, growing=True, running=["wf/a", "wf/b"],
...                 tiers=[("/dev/shm", 3 * 2**30, 8 * 2**30)], backlog_bytes=300 * 2**20, backlog_files=12,
...                 rate=25e6, eta=190)
>>> print(snap.line())
12/40+ nodes · to home: 300.0 MiB (12 files) at 25 MB/s · elapsed 1m15s · /dev/shm 3.0 GiB of 8.0 GiB · running: wf/a, wf/b
>>> print(snap.line(width=60))
12/40+ nodes · to home: 300.0 MiB (12 files) at 25 MB/s
>>> print(Snapshot(elapsed=75, done=12, total=40, growing=False, eta=190).line())
12/40 nodes · ETA 3m10s · elapsed 1m15s

While the total is a floor (``40+``: Pydra adds a node's jobs as it starts), the work left is not
known, and no ETA is shown (it said "ETA 0s" with 2 of 90+ left, and the run went on).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .sizes import format_size

EVERY = 30.0  # seconds between two plain lines
BAR_EVERY = 0.25  # seconds between two updates of a terminal's line
BAR_COLUMNS = len("[Sea] ") + 12 + 2  # what comes before the figures on a terminal's line, and a margin
MODES = ("auto", "bar", "lines", "off")


def duration(seconds: float) -> str:
    """``95`` -> ``1m35s``; hours past one hour.

    >>> duration(4), duration(95), duration(3725)
    ('4s', '1m35s', '1h02m')
    """
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass
class Snapshot:
    """The engine's figures at one moment."""

    elapsed: float
    done: int  # nodes finished (run, found done, failed)
    total: int
    growing: bool  # the engine adds nodes as it goes (Pydra): the total is a floor
    running: list[str] = field(default_factory=list)  # names of nodes running now
    tiers: list[tuple[str, int, int | None]] = field(default_factory=list)  # (path, bytes held, room)
    backlog_bytes: int = 0  # waiting to be copied home
    backlog_files: int = 0
    rate: float | None = None  # bytes per second copied home lately
    eta: float | None = None  # seconds left, from learned run times and the backlog

    def line(self, shown: int = 3, width: int | None = None) -> str:
        """The figures, the most useful first (nodes done of the total, the ETA, what waits to go
        home), the running nodes' names last; cut to ``width`` characters, if given, by naming fewer
        running nodes, then by leaving fields out from the end (the nodes done stay)."""
        parts = [f"{self.done}/{self.total}{'+' if self.growing else ''} nodes"]
        if self.eta is not None and self.done < self.total and not self.growing:
            parts.append(f"ETA {duration(self.eta)}")
        if self.backlog_files:
            rate = f" at {self.rate / 1e6:.0f} MB/s" if self.rate else ""
            parts.append(f"to home: {format_size(self.backlog_bytes)} ({self.backlog_files} files){rate}")
        parts.append(f"elapsed {duration(self.elapsed)}")
        for path, held, room in self.tiers:
            parts.append(f"{path} {format_size(held)}" + (f" of {format_size(room)}" if room else ""))
        candidates = [" · ".join([*parts, self._running(n)]) for n in range(min(shown, len(self.running)), 0, -1)]
        candidates.append(" · ".join(parts))
        if width is None:
            return candidates[0]
        for text in candidates:
            if len(text) <= width:
                return text
        while len(parts) > 1 and len(" · ".join(parts)) > width:
            parts.pop()
        return " · ".join(parts)[:width]

    def _running(self, shown: int) -> str:
        more = f" +{len(self.running) - shown}" if len(self.running) > shown else ""
        return "running: " + ", ".join(self.running[:shown]) + more


class WorkLeft:
    """Seconds of work left, from each kind of node's learned run time (this run's, else the
    history's); cost per event is constant, an estimate costs one step per kind.

    >>> left = WorkLeft({"Smooth": 10.0})
    >>> left.add("Smooth"); left.add("Smooth"); left.add("Mask")
    >>> left.seconds(), left.done("Smooth", 12.0), left.seconds()
    (30.0, None, 20.0)
    """

    def __init__(self, learned: Mapping[str, float]):
        self._learned = learned  # kind -> seconds, updated by the engine's estimator
        self._pending: dict[str, int] = {}
        self.busy = 0.0  # seconds nodes of this run have run, all together
        self.since: float | None = None  # when the first node started (the parallelism is measured from then)

    def add(self, kind: str) -> None:
        self._pending[kind] = self._pending.get(kind, 0) + 1

    def done(self, kind: str, seconds: float | None = None, started: float | None = None) -> None:
        if self._pending.get(kind):
            self._pending[kind] -= 1
        self.busy += seconds or 0.0
        if started is not None and (self.since is None or started < self.since):
            self.since = started

    def seconds(self) -> float | None:
        """``None`` until some kind has a run time."""
        known = [s for s in self._learned.values() if s > 0]
        if not known:
            return None
        typical = sum(known) / len(known)  # for kinds not seen yet
        return sum(n * self._learned.get(kind, typical) for kind, n in self._pending.items())

    def eta(self, now: float) -> float | None:
        """Work left over the parallelism seen since the first node started (busy seconds per second
        of the run from then: the time before it, the engine's own start, is no node's).

        >>> left = WorkLeft({"Smooth": 10.0})
        >>> for _ in range(4): left.add("Smooth")
        >>> left.done("Smooth", 10.0, started=2.0); left.done("Smooth", 10.0, started=2.0)
        >>> left.eta(now=12.0)  # 2 x 10 s left, 2 at a time
        10.0
        """
        left = self.seconds()
        if left is None or self.busy <= 0 or self.since is None or now <= self.since:
            return None
        return left / max(self.busy / (now - self.since), 0.1)


class Rate:
    """Bytes per second over the last ``window`` seconds of a growing total."""

    def __init__(self, window: float = 20.0):
        self._window = window
        self._points: deque[tuple[float, int]] = deque()

    def __call__(self, now: float, total: int) -> float | None:
        self._points.append((now, total))
        while len(self._points) > 2 and now - self._points[0][0] > self._window:
            self._points.popleft()
        (t0, b0), (t1, b1) = self._points[0], self._points[-1]
        return (b1 - b0) / (t1 - t0) if t1 - t0 >= 1.0 and b1 > b0 else None


class Progress:
    """Shows ``snapshot()`` from a thread of its own until :meth:`stop`: a bar on a terminal, a line
    every ``every`` seconds to ``log`` otherwise (``mode``: auto, bar, lines or off)."""

    def __init__(self, snapshot: Callable[[], Snapshot], mode: str = "auto", log: logging.Logger | None = None, every: float | None = None, stream=None):
        self._snapshot = snapshot
        self._log = log or logging.getLogger("sea")
        self._stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if _is_terminal(self._stream) else "lines"
        self.mode = mode
        self._every = BAR_EVERY if mode == "bar" else every or EVERY
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None
        self._redirect = None

    def start(self) -> Progress:
        if self.mode == "off" or self._thread is not None:
            return self
        if self.mode == "bar":
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            sized = _width(self._stream) > 0  # a terminal that says its width (a bare pty says 0)
            self._bar = tqdm(
                total=0, file=self._stream, dynamic_ncols=sized, ncols=None if sized else 200, nrows=None if sized else 50, bar_format="[Sea] {bar:12} {desc}", leave=False
            )
            self._redirect = logging_redirect_tqdm(loggers=_console_loggers())  # log lines above the bar
            self._redirect.__enter__()
            bar = weakref.ref(self._bar)
            # a worker process forked now (MultiProc's) logs through the same handlers: each of
            # its lines clears the line first, as here, but its copy is never drawn again, stale
            os.register_at_fork(after_in_child=lambda: _forked(bar()))
        self._thread = threading.Thread(target=self._run, name="sea-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop showing (the report follows); a terminal's line is wiped."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self._bar is not None:
            self._bar.close()
            self._redirect.__exit__(None, None, None)
            self._bar = self._redirect = None

    def _run(self) -> None:
        if self._bar is not None:  # a terminal's line is there from the start
            self._tick()
        while not self._stop.wait(self._every):
            self._tick()

    def _tick(self) -> None:
        try:
            self._show(self._snapshot())
        except Exception:  # noqa: BLE001 - showing progress must never harm the run
            self._log.debug("[Sea] progress not shown", exc_info=True)

    def _show(self, snap: Snapshot) -> None:
        if self._bar is None:
            self._log.info("[Sea] progress: %s", snap.line())
            return
        self._bar.total = max(snap.total, snap.done, 1)
        self._bar.n = snap.done
        width = _width(self._stream)  # what the terminal has now, less "[Sea] " and the bar
        self._bar.set_description_str(snap.line(width=width - BAR_COLUMNS if width > BAR_COLUMNS else None), refresh=False)
        self._bar.refresh()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _forked(bar) -> None:
    """In a forked worker: its log lines wipe the terminal's line whole, and never draw it again."""
    if bar is None:
        return

    def wipe(*args, **kwargs) -> None:
        bar.fp.write("\r\x1b[K")

    bar.clear, bar.refresh = wipe, lambda *args, **kwargs: None


def _width(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


def _console_loggers() -> list[logging.Logger]:
    """The loggers that print to the terminal (the root's, Nipype's, Sea's own)."""
    manager = logging.Logger.manager
    loggers = [logging.getLogger()] + [lg for lg in manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    return [lg for lg in loggers if any(getattr(h, "stream", None) in (sys.stdout, sys.stderr) for h in lg.handlers)]
