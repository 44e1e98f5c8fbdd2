"""Byte sizes as people write them in configuration files ("4GiB", "500 MB", "80%").

A single-letter unit is binary, as SLURM's ``--tmp=4G`` and ``df -h`` mean it: ``4G`` is 4 GiB;
``4GB`` (two letters) is 4 * 1000**3 bytes, ``4GiB`` 4 * 1024**3.

>>> parse_size("4G") == parse_size("4GiB") == 4 * 1024**3, parse_size("4gb")
(True, 4000000000)
"""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def parse_size(text: str | int | float) -> int:
    """Bytes in ``text``; raises ``ValueError`` with the accepted forms."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a size")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"{text!r} is negative: give a size of 0 or more, e.g. '4GiB'")
        if isinstance(text, float) and not math.isfinite(text):
            raise ValueError(f"{text!r} is not a size: give a finite number of bytes, or a number with a unit, e.g. '4GiB'")
        return int(text)
    match = _SIZE.match(str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"{text!r} is not a size: write a number with an optional unit "
            "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. '4GiB'"
        )
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is too large to be a size: write it with a unit, e.g. '4GiB'")
    return int(value)


def is_bare_number(value: object) -> bool:
    """A number with no unit (``500``, ``"500"``), which a capacity must not be: 500 bytes is
    never what was meant."""
    if isinstance(value, bool):
        return False
    match = _SIZE.match(str(value))
    return isinstance(value, (int, float)) or (match is not None and match.group(2) == "")


def parse_fraction(text: str) -> float | None:
    """``0.8`` for ``"80%"``; ``None`` when ``text`` is not a percentage."""
    match = _PERCENT.match(str(text))
    if not match:
        return None
    value = float(match.group(1)) / 100
    if not 0 < value <= 1:
        raise ValueError(f"{text!r} is not a percentage between 0% and 100%")
    return value


def format_size(n: float) -> str:
    """Human-readable binary size: ``format_size(3 * 2**20) == '3.0 MiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
