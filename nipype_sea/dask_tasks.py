"""Nipype's jobs as Dask tasks: the loop both SeaDask and the benchmark's plain Dask plugin use.

:class:`DaskTaskLoop` is Nipype's task loop (:class:`~nipype_sea._nipype_internals.EventedTaskLoop`)
whose tasks are Dask futures. Each outcome is fetched in Dask's callback thread the moment its task
ends, and the future let go: a finished future kept while its worker dies is recomputed by Dask,
on that worker only, that is never. The loop then wakes.
"""

from __future__ import annotations

import functools
import traceback
import uuid
from itertools import count

from . import _nipype_internals as nx_

RESULT_TIMEOUT = 60.0  # seconds to fetch a finished task's outcome (a few hundred bytes) from its worker


class DaskTaskLoop(nx_.EventedTaskLoop):
    """Subclasses submit with :meth:`submit_task` (in their ``_submit_job``) while ``client`` is
    the run's ``distributed.Client``; :meth:`take_outcome` gives a task's outcome once."""

    def __init__(self, plugin_args=None):
        super().__init__(plugin_args=plugin_args)
        self.client = None
        self._ids = count()
        self.token = uuid.uuid4().hex[:12]  # the run's, in each task's key: runs sharing a scheduler never share a task
        self._futures: dict[int, tuple[object, object]] = {}  # taskid -> (tag, future)
        self._outcomes: dict[int, object] = {}  # taskid -> what the task returned, or its exception

    def submit_task(self, function, *args, tag=None, name: str = "task", **options) -> int:
        """``function(*args)`` on Dask (``options`` as ``Client.submit``'s); ``tag``: what the
        subclass calls the task (see :meth:`running`)."""
        taskid = next(self._ids)
        future = self.client.submit(function, *args, pure=False, key=f"{name}-{self.token}-{taskid}", **options)
        self._futures[taskid] = (tag, future)
        future.add_done_callback(functools.partial(self._collect, taskid))
        return taskid

    def _collect(self, taskid: int, future) -> None:
        if self.client is None or future.status == "cancelled":
            # cancelled (a lost worker's task, or the run stopped as the client closes): asking such
            # a future for its result would wait on the client's loop, which may be gone
            self._outcomes[taskid] = RuntimeError(f"task {future.key} ended as {future.status}")
        else:
            try:
                self._outcomes[taskid] = future.result(timeout=RESULT_TIMEOUT)
            except BaseException as exc:  # noqa: BLE001 - its worker died before we had the outcome
                self._outcomes[taskid] = exc
        self.wake()

    def running(self) -> dict[int, tuple[object, object]]:
        """taskid -> (tag, future) of the tasks submitted and not cleared (a copy)."""
        return dict(self._futures)

    def tag_of(self, taskid: int):
        """The tag the task was submitted with."""
        return self._futures[taskid][0]

    def cancel(self, taskids) -> None:
        """Stop these tasks and forget them (their jobs are requeued, or the run ends)."""
        for taskid in list(taskids):
            _tag, future = self._futures.pop(taskid)
            future.cancel()
            self._outcomes.pop(taskid, None)

    def task_done(self, taskid) -> bool:
        return taskid in self._outcomes

    def take_outcome(self, taskid):
        """The task's outcome (what it returned, or its exception), once; ``None`` while it runs."""
        return self._outcomes.pop(taskid, None)

    def put_back(self, taskid, outcome) -> None:
        """An outcome taken too early (see SeaDask's lost workers): taken again at the next round."""
        self._outcomes[taskid] = outcome

    def _get_result(self, taskid):
        """Nipype's result dict: the task's own, or its exception's traceback."""
        outcome = self.take_outcome(taskid)
        if isinstance(outcome, BaseException):
            return {"result": None, "traceback": traceback.format_exception(outcome)}
        return outcome

    def _clear_task(self, taskid):
        self._futures.pop(taskid, None)
        self._outcomes.pop(taskid, None)
