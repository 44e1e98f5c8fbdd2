"""One Sea run per work directory at a time.

Two runs on one ``base_dir`` (a job resubmitted while the first still runs, two array tasks given
the same work directory) would sweep each other's temporary copies, replace each other's node
directories and race on the same outputs. The second run is refused before it touches anything,
in one line naming the first (host, PID, start), by a lock file in ``base_dir/.sea``: created with
``O_EXCL`` (atomic on NFS v3+ and Lustre, unlike ``flock`` across machines) and touched every
:data:`HEARTBEAT` seconds while the run lives. A lock is stale, and taken over with a warning, when
its holder is known dead: on this host and in this PID namespace, its PID gone (or reused by a
younger process); on another host, or in another PID namespace (a container, which shares the
host's name under ``--network=host`` and sees none of its PIDs), no heartbeat for
:data:`STALE_AFTER` seconds.

>>> import json, tempfile, pathlib
>>> home = pathlib.Path(tempfile.mkdtemp())
>>> lock = RunLock.acquire(home); (home / LOCK).exists()
True
>>> lock.release(); (home / LOCK).exists()
False
>>> _ = (home / LOCK).write_text(json.dumps({"host": "node042", "pid": 4242, "started": 0}))  # another machine's run
>>> RunLock.acquire(home)  # doctest: +ELLIPSIS
Traceback (most recent call last):
sea.lock.SeaRunLocked: another Sea run is using ... (host node042, PID 4242, started ...); ...
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

import psutil

from .config import SeaConfigError
from .private import in_use, pid_namespace, seen_by_lock

logger = logging.getLogger("sea")

LOCK = Path(".sea") / "run.lock"
HEARTBEAT = 30.0
STALE_AFTER = 300.0


class SeaRunLocked(SeaConfigError):
    """Another Sea run holds the work directory."""


class RunLock:
    def __init__(self, path: Path, holder: dict, replaced: dict | None = None, fd: int | None = None):
        self.path = path
        self._fd = fd  # holds the lock file's flock while the run lives (see _stale)
        self.holder = holder
        self.replaced = replaced  # the record of a run that was gone when this one took its lock over
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="sea-lock", daemon=True)
        self._beat.start()

    @classmethod
    def acquire(cls, home: Path) -> RunLock:
        path = Path(home) / LOCK
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _unwritable(home, exc) from None
        me = {"host": socket.gethostname(), "pid": os.getpid(), "pidns": pid_namespace(), "started": time.time(), "created": psutil.Process().create_time()}
        replaced = None
        for _ in range(3):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = _read(path)
                if not _stale(path, holder):
                    raise SeaRunLocked(_refusal(home, path, holder)) from None
                if not _mine(holder, me):  # (a container's first process is PID 1 in each container)
                    logger.warning("[Sea] %s was left by a run that is gone (%s); taking it over", path, _who(holder))
                    replaced = holder
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                continue
            except OSError as exc:  # a home that refuses writes (read-only, full, failing)
                raise _unwritable(home, exc) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                me["flock"] = True  # what other runs may judge it by (see _stale)
            except OSError:
                me["flock"] = False  # no locks here (Lustre mounted noflock), or another user who may read it holds one: judged by its heartbeat
            try:
                os.write(fd, json.dumps(me).encode())
            except BaseException:
                os.close(fd)
                os.unlink(path)
                raise
            return cls(path, me, replaced, fd)
        raise SeaRunLocked(_refusal(home, path, _read(path)))

    @property
    def killed_run(self) -> dict | None:
        """The record of the run whose lock this one took over (it was killed): its ``host``,
        ``pid``, ``started`` (when), as it wrote them."""
        return self.replaced or None

    def release(self) -> None:
        self._stop.set()
        if _read(self.path) == self.holder:  # never another run's lock
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            except OSError:  # the home refuses writes: left, the next run takes it over (its flock went with this one)
                logger.warning("[Sea] %s could not be removed; the next run takes it over", self.path)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            try:
                os.utime(self.path)
            except OSError:
                pass  # the home unreachable a moment: the next beat tries again


def _unwritable(home: Path, exc: OSError) -> SeaConfigError:
    return SeaConfigError(f"cannot write in the work directory {str(home)!r} ({exc.strerror or exc}): the run needs to write there")


def _read(path: Path) -> dict:
    try:
        holder = json.loads(path.read_text())
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}  # being written this instant, or damaged: judged by its age


def _stale(path: Path, holder: dict) -> bool:
    """Its holder is gone, or is this process (a run in it that ended without closing)."""
    same_host = holder.get("host") == socket.gethostname()
    same_pids = holder.get("pidns", pid_namespace()) == pid_namespace()  # (a lock written before Sea recorded it: as before)
    # a run in a container (or the host, seen from one): its PID says nothing here, its flock does,
    # if it holds one (another user who may read the file could have held it first, for a moment)
    if holder.get("flock") is True and seen_by_lock(path, holder.get("host", ""), holder.get("pidns")) and in_use(path) is False:
        return True
    # held (or no flock here): by its heartbeat, as on another host (anyone who may read the file
    # may hold a lock on it too: a live run's heartbeat says it lives, not the lock alone)
    if same_host and same_pids and isinstance(holder.get("pid"), int):
        if holder["pid"] == os.getpid():
            return True
        try:
            process = psutil.Process(holder["pid"])
            # a younger process (the PID reused), or the run killed and not yet reaped by its parent
            # (a zombie: `timeout -s KILL` leaves one for a second or two)
            return process.create_time() > holder.get("created", 0) + 1 or process.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True
    try:
        return time.time() - path.stat().st_mtime > STALE_AFTER
    except FileNotFoundError:
        return True


def _mine(holder: dict, me: dict) -> bool:
    """The record is this very process's (a run in it that ended without closing)."""
    return all(holder.get(k) == me[k] for k in ("host", "pid", "pidns", "created"))


def _who(holder: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"])) if "started" in holder else "?"
    return f"host {holder.get('host', '?')}, PID {holder.get('pid', '?')}, started {started}"


def _refusal(home: Path, path: Path, holder: dict) -> str:
    return (
        f"another Sea run is using {home} ({_who(holder)}); wait for it to end or give this run another work directory (base_dir, cache_root) "
        f"(if that run is dead but its host cannot tell, remove {path})"
    )
