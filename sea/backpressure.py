"""Back-pressure: the link home is finite, so a run neither makes declared outputs faster than it
can carry them nor spills to the slow home for room that is on its way.

On a busy shared filesystem compute makes declared outputs (what sinks write) faster than the link
carries them home: they wait on the fast tier, and on a small tier the next node finds no room and
its directory spills home, where it is written at the busy link's rate beside the outputs it
competes with, and read back from there. :class:`BackPressure` holds a ready node back, until a node
ends or a copy home commits (the adapter asks again then), in two cases:

- *room on its way*: its directory would spill home now, and would fit once the backlog commits
  (its directories leave the tier) and the running nodes end (the directories they were the last
  readers of leave). With nothing running and nothing to copy, it starts (and spills).
- *the link behind*: it leads to a sink and grows the tiers (a node that starts a new chain, not
  one that replaces its producer's directory with its own), and the backlog would not drain, at
  the rate measured lately, before its own declared bytes arrive (the node and the steps after it
  down to a sink take less time), or is already more than the fast tiers' room. The backlog may
  always hold one node's worth (the largest node seen) per stager thread, so the link never waits
  for the compute that refills it.

The backlog is what the run needs home (declared outputs, directories that must go), not
``checkpoints: auto``'s optional copies, which give way to it. A run whose link keeps up has no
backlog to speak of, and nothing is held. ``backpressure: false`` turns both off.

>>> bp = BackPressure.__new__(BackPressure)
>>> bp.backlog_seconds(backlog=60e6, rate=30e6), bp.backlog_seconds(backlog=60e6, rate=None)
(2.0, inf)
"""

from __future__ import annotations

import time

from .progress import Rate
from .run_state import Run, State

RATE_WINDOW = 5.0  # seconds of commits the rate home is measured over


class BackPressure:
    """Which ready nodes wait for the link home (see the module's docstring). Called under ``Run.lock``."""

    def __init__(self, run: Run):
        self.run = run
        self._rate = Rate(RATE_WINDOW)
        self._to_sink: dict[str, int | None] = {}  # nodes on the way to a sink, counting itself; None: no sink after it
        self._seconds = 0.0  # node run times seen, for the mean
        self._runs = 0
        self._largest = 0  # the largest node directory seen: the backlog may always hold that much
        self.held: set[str] = set()  # nodes held back at least once

    def node_ran(self, seconds: float | None, size: int) -> None:
        self._largest = max(self._largest, size)
        if seconds is not None:
            self._seconds += seconds
            self._runs += 1

    def holds(self, key: str, running: int) -> bool:
        """Whether ready node ``key`` waits (``running`` nodes run now): for room on a fast tier
        that is on its way, or for the link home to catch up (see the module's docstring)."""
        run = self.run
        if not run.config.backpressure:
            return False
        # room comes as any copy home commits (an optional checkpoint's directory done with leaves
        # then too); the link is behind only for what the run needs home (optional copies give way)
        all_copies, needed = run.stager.backlog[0], run.stager.needed_backlog
        held = self._waits_for_room(key, running, all_copies) or self._link_behind(run.graph.owner(key) or key, needed)
        if held:
            self.held.add(key)
        return held

    def _waits_for_room(self, key: str, running: int, backlog: int) -> bool:
        """``key``'s directory would spill to the home now, and room for it comes sooner than the
        spill would cost (its write, and as long again for the backlog it delays): as the backlog
        commits (its directories go), and as the running nodes expected to end by then end (the
        directories they were the last readers of go). Written home, its readers would also read
        it from the slow home. A node that runs for hours is not waited for."""
        if not (running or backlog):
            return False
        run = self.run
        estimate = run.estimate(key)
        if run.hierarchy.has_room(estimate):
            return False
        rate = self._rate(time.monotonic(), run.stager.committed_bytes)
        # what the spill costs: its write (at the rate copies go home now; before any committed, as
        # the copy cost model predicts it: the last run's copies here, or `sea probe`'s), and as long
        # again for the backlog it shares the link with
        horizon = 2 * (estimate / rate if rate else run.checkpoints.cost.predict(1, estimate))
        soon = sum(self._freed_by(r) for r in run.running if self._ends_within(r, horizon))
        needed = estimate - self.fast_room() - soon  # from the backlog's commits
        return needed <= 0 or (needed <= backlog and (not rate or needed / rate <= horizon))

    def _ends_within(self, key: str, seconds: float) -> bool:
        """Running node ``key`` is expected to end within ``seconds``, by its kind's last run time
        (no node of its kind ended yet: the mean node's)."""
        node = self.run.nodes.get(key)
        if node is None or not node.started:
            return False
        expected = self.run.estimator.seconds.get(node.spec.kind)
        if expected is None:
            expected = self._mean_seconds()
        if not expected:
            return False  # no node ended yet: nothing says when it will
        now = time.monotonic()
        left = node.started + expected - now
        if left >= 0:
            return left <= seconds
        # past its usual time (a loaded machine slows every node): expected to run as long again as
        # it has run so far, so one that has run for minutes is not waited for
        return now - node.started <= seconds

    def _mean_seconds(self) -> float:
        return self._seconds / self._runs if self._runs else 0.0

    def _link_behind(self, key: str, backlog: int) -> bool:
        """``key`` (a node of the graph; a MapNode's sub-node asks as its MapNode) adds declared
        bytes (it leads to a sink and grows the tiers), and the backlog, beyond one node's worth per
        stager thread, would not drain before they arrive."""
        run = self.run
        if backlog <= self._largest * run.config.stager_threads:
            return False
        steps = self.steps_to_sink(key)
        if steps is None or self.growth(key) <= 0:
            return False
        rate = self._rate(time.monotonic(), run.stager.committed_bytes)
        return backlog > self.fast_room() or self.backlog_seconds(backlog, rate) > steps * self._mean_seconds()

    @staticmethod
    def backlog_seconds(backlog: float, rate: float | None) -> float:
        """How long the backlog takes to go home at ``rate`` (while no rate is measured yet, more
        than one node's worth is too much)."""
        return backlog / rate if rate else float("inf")

    def fast_room(self) -> int:
        return sum(max(t.room(), 0) for t in self.run.hierarchy.fast_tiers)

    def growth(self, key: str) -> int:
        """The bytes ``key`` adds to the tiers once it finished: its estimated size less the
        directories it is the last reader of (they go when it finishes)."""
        return self.run.estimate(key) - self._freed_by(key)

    def _freed_by(self, key: str) -> int:
        """Bytes on fast tiers that go when ``key`` ends: its producers' directories it is the last reader of."""
        run = self.run
        freed = 0
        for p in run.graph.producers(key):
            node = run.nodes.get(p)
            if node is not None and node.state is State.FINISHED and not node.evicted and node.consumers_left <= {key}:
                if node.placement is not None and not node.placement.tier.is_home:
                    freed += node.size
        return freed

    def steps_to_sink(self, key: str) -> int | None:
        """Nodes from ``key`` (itself counted) down to the nearest sink; ``None`` if no sink is
        reached. Remembered: each node is walked once."""
        if key in self._to_sink:
            return self._to_sink[key]
        graph, order = self.run.graph, {key}
        stack = [key]
        while stack:  # the consumers not known yet
            for consumer in graph.consumers(stack.pop()):
                if consumer not in self._to_sink and consumer not in order:
                    order.add(consumer)
                    stack.append(consumer)
        for node in sorted(order, key=graph.index, reverse=True):  # consumers first
            spec = graph.nodes[node]
            if spec.sink_destination is not None or spec.persist_dir:
                self._to_sink[node] = 1
                continue
            below = [s for c in graph.consumers(node) if (s := self._to_sink.get(c)) is not None]
            self._to_sink[node] = 1 + min(below) if below else None
        return self._to_sink[key]
