"""What a user sees of Sea: its own logger, shown by default, and a situation Sea can name ending a
script in one line instead of a traceback.

Sea logs to the ``sea`` logger (its own, whatever the engine's logging says: quieting Nipype's
``workflow_level`` leaves Sea's progress and report alone). :func:`show_log` makes it visible at INFO
when nothing else would show it; to quiet it, ``logging.getLogger("sea").setLevel("WARNING")``.

Errors Sea raises for a situation it can name (a bad configuration, a home moved away, an output it
could not commit) are :class:`SeaError` s, whose message is one line saying what is wrong and what to
do. :func:`one_line_errors` makes an uncaught one end the script with that line alone::

    >>> import subprocess, sys
    >>> script = "from sea.console import SeaError, one_line_errors; one_line_errors(); raise SeaError('tiers[0]: write 500GiB')"
    >>> done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    >>> done.returncode, done.stderr
    (1, 'sea: error: tiers[0]: write 500GiB\\n')

``SEA_TRACEBACK=1`` in the environment gives back Python's traceback.
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("sea")


class SeaError(Exception):
    """A situation Sea can name; the message is one line that says what to do."""


def show_log() -> None:
    """Sea's messages at INFO and above reach the user: through the handlers they configured (the
    root logger's), else through a handler of Sea's own on standard error."""
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%y%m%d-%H:%M:%S"))
        logger.addHandler(handler)
        logger.propagate = False  # a logging.basicConfig() made later would print each line twice


def sea_error(error: BaseException | None) -> SeaError | None:
    """The :class:`SeaError` behind ``error`` (an engine may re-raise it wrapped), if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, SeaError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def one_line_errors() -> None:
    """An uncaught :class:`SeaError` ends the script with ``sea: error: <its line>`` on standard
    error (exit status 1) instead of a traceback through the engine; any other error is left to
    the hook there was before."""
    if getattr(sys.excepthook, "sea", False):
        return
    previous = sys.excepthook

    def hook(kind, value, traceback):
        error = sea_error(value)
        if error is None or os.environ.get("SEA_TRACEBACK"):
            previous(kind, value, traceback)
        else:
            print(f"sea: error: {error}", file=sys.stderr)

    hook.sea = True
    sys.excepthook = hook


def attach() -> None:
    """What an adapter calls first, before it reads its configuration: Sea's log shown, and its
    errors one line."""
    show_log()
    one_line_errors()
