"""Sea's configuration: one typed dataclass, read from a dict, a YAML file or ``$SEA_CONFIG``.

Every field carries its documentation in its metadata (``doc`` and ``example``); the same text
feeds ``docs/configuration.md`` (see ``sea config-docs``) and the error messages, so the three
cannot drift apart. Every problem is raised as one :class:`SeaConfigError` line that says what is
wrong and how to fix it, before any node runs.
"""

from __future__ import annotations

import difflib
import enum
import numbers
import os
import re
import string
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from .console import SeaError
from .progress import MODES
from .sizes import is_bare_number, parse_fraction, parse_size

ENV_VAR = "SEA_CONFIG"


class SeaConfigError(SeaError, ValueError):
    """A configuration problem, stated in one line with its fix."""

    def __init__(self, message: str):
        # one line, whatever a repr of the user's value (a 2-D array, a path with a newline) holds
        super().__init__(" ".join(str(message).splitlines()))


class Mode(str, enum.Enum):
    """Sea's four data-management modes (``.sea_flushlist`` / ``.sea_evictlist`` semantics)."""

    COPY = "copy"  # flush home, keep on the fast tier until its consumers are done
    MOVE = "move"  # flush home, then evict
    REMOVE = "remove"  # evict without flushing
    KEEP = "keep"  # neither: stays on the fast tier after the run

    @property
    def flushes(self) -> bool:
        return self in (Mode.COPY, Mode.MOVE)


class Checkpoints(str, enum.Enum):
    """Which node directories go home so that a rerun need not recompute them (see sea/checkpoint.py)."""

    AUTO = "auto"  # those whose recomputation costs more than their copy home
    NONE = "none"  # none: a rerun recomputes every evicted producer a changed node needs
    ALL = "all"  # every one (keep_intermediates: true): reruns as under the engine's own plugin


CAPACITY_DOC = (
    "a size ('4GiB'; a one-letter unit is binary, as in SLURM's --tmp=4G: '4G' is 4GiB, '4GB' is "
    "4*10^9 bytes) or a share of its filesystem ('80%'); a number without a unit is refused"
)


@dataclass(frozen=True)
class TierSpec:
    """One storage tier as the user wrote it (${VAR} are expanded, and the path checked, where the tiers are made)."""

    path: str = field(metadata={"doc": "directory on node-local storage; must exist; ${VAR} expanded on the machine that uses it"})
    capacity: str | None = field(
        default=None,
        metadata={"doc": "cap on top of the real free space: " + CAPACITY_DOC},
    )


@dataclass(frozen=True)
class Rule:
    """An override of what the graph decides for the files whose path matches ``pattern``."""

    pattern: str = field(metadata={"doc": "glob on the path relative to the home ('**' crosses directories), or 're:' + a regex"})
    mode: Mode = field(metadata={"doc": "copy | move | remove | keep"})

    def matches(self, relpath: str) -> bool:
        return _compile_pattern(self.pattern).fullmatch(relpath) is not None

    @property
    def regex(self) -> re.Pattern[str]:
        return _compile_pattern(self.pattern)


@dataclass(frozen=True)
class PrefetchSpec:
    """Copying the workflow's input files from the shared filesystem to a fast tier ahead of their readers."""

    enabled: bool | str = field(
        default="auto",
        metadata={"doc": "copy input files ahead of the nodes that read them: true, false, or auto (the default: on once the shared "
                         "filesystem proves slow to read, its first copy of a file of 1 MiB or more taking at least 4 times as long as "
                         "copying it again within the tier; until then smaller files are read where they are)"},
    )
    budget: str = field(default="25%", metadata={"doc": "room prefetched copies may take on a tier: a size ('2GiB') or a share of it ('25%')"})
    lookahead: int = field(default=4, metadata={"doc": "how many of the next reader nodes have their files copied ahead"})


def _compile_pattern(pattern: str) -> re.Pattern[str]:
    if pattern.startswith("re:"):
        return re.compile(pattern[3:])
    return re.compile(glob_to_regex(pattern))


def glob_to_regex(pattern: str) -> str:
    """Translate a path glob: ``*`` and ``?`` stay in one path component, ``**`` crosses them."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def _doc(doc: str, example: Any = None) -> dict[str, Any]:
    return {"doc": doc, "example": example}


@dataclass(frozen=True)
class SeaConfig:
    """What ``plugin_args['sea']`` (or the YAML file it names, or ``$SEA_CONFIG``) holds."""

    tiers: tuple[TierSpec, ...] | None = field(
        default=None,
        metadata=_doc(
            "node-local storage tiers, fastest first; the workflow's base_dir (the home, on the shared "
            "filesystem) is the last tier, implicit. Without this key Sea uses $SLURM_TMPDIR, then $TMPDIR, "
            "then /dev/shm, skipping any on the home's filesystem. Sea works in a private (0700) subdirectory "
            "it creates in each. A tier has a path (~ and ${VARS} expanded; one that does not exist is refused, "
            "never skipped) and an optional capacity, a cap on top of its free space: " + CAPACITY_DOC + ".",
            [{"path": "/dev/shm", "capacity": "4GiB"}, {"path": "${SLURM_TMPDIR}/sea"}],
        ),
    )
    rules: tuple[Rule, ...] = field(
        default=(),
        metadata=_doc(
            "overrides of what the graph decides, first match wins: copy (flush home and keep), move (flush "
            "home and evict), remove (evict, never flush), keep (leave on the tier)",
            [{"pattern": "**/_report/**", "mode": "copy"}],
        ),
    )
    checkpoints: Checkpoints = field(
        default=Checkpoints.AUTO,
        metadata=_doc(
            "which node directories are copied home, in the background and after declared outputs, so a "
            "rerun (after a change, a kill, a wall-time limit) reuses them through the engine's own cache: "
            "auto (a node whose recomputation, with the evicted producers it needs, would take longer than "
            "copying its directory home), none (only declared outputs go home; a rerun recomputes what a "
            "changed node needs), all (every node directory: reruns re-execute exactly what MultiProc or "
            "cf would, for the most bytes and files on the shared filesystem). Whatever the mode, the "
            "directory of a node nothing consumes (the workflow's result, unless it is a sink) goes home",
            "auto",
        ),
    )
    checkpoint_factor: float = field(
        default=1.0,
        metadata=_doc(
            "with checkpoints: auto, a node's directory is copied home when recomputing it (and the evicted "
            "producers it needs) would take more than this many times as long as the copy; lower keeps more "
            "(a faster rerun, more bytes and files on the shared filesystem), higher fewer",
            1.0,
        ),
    )
    checkpoint_budget: str = field(
        default="100%",
        metadata=_doc(
            "with checkpoints: auto, what the checkpoints may hold in the home: a share of the bytes the run "
            "delivers there (declared outputs, directories that go home whole; '100%', the default, up to "
            "'1000%') or a size ('2GiB'). They also never take more than half of what the home's free space "
            "and your quota (lfs quota on Lustre, quota elsewhere) leave beyond the outputs still to come. "
            "Each checkpoint is one file (a pack) in base_dir/.sea/checkpoints; the ones that spare a rerun the "
            "most recomputation per byte are kept",
            "100%",
        ),
    )
    keep_intermediates: bool = field(
        default=False,
        metadata=_doc("the same as checkpoints: all (Sea's copy-all; kept for existing configurations)", False),
    )
    backpressure: bool = field(
        default=True,
        metadata=_doc(
            "hold back a ready node that would add declared outputs (it leads to a sink) while the copies "
            "home are behind: their backlog would not drain, at the rate measured, before the node's own "
            "outputs arrive. Keeps the fast tiers from filling with outputs waiting for a busy link; a run "
            "whose link keeps up is never held",
            True,
        ),
    )
    logical_paths: bool = field(
        default=True,
        metadata=_doc(
            "run each node at its directory's path in the home, in a private mount namespace, while its "
            "bytes live on a tier: the command lines and working directories programs record (MRtrix3, "
            "AFNI) name the home, as under the engine's own plugin. Where namespaces are not allowed the "
            "nodes run at their tier paths and the report says why; false: always at their tier paths",
            True,
        ),
    )
    stager_threads: int = field(
        default=2,
        metadata=_doc(
            "files the stager copies home at once, in the background, each by a thread of its own (as many threads again make "
            "the written files durable and put them in place, so the link does not wait on that)",
            2,
        ),
    )
    report: str = field(
        default="sea-report.json",
        metadata=_doc("where the end-of-run report is written, relative to the home (base_dir)", "sea-report.json"),
    )
    sinks: tuple[str, ...] = field(
        default=("DataSink",),
        metadata=_doc(
            "interface class names whose base_directory receives declared outputs (staged on a fast tier, "
            "copied home by the stager)",
            ["DataSink", "DerivativesDataSink"],
        ),
    )
    prefetch: PrefetchSpec = field(
        default=PrefetchSpec(),
        metadata=_doc(
            "copy the workflow's input files (what data grabbers and node inputs point at on the shared "
            "filesystem) to the fastest tier with room ahead of the nodes that read them, in the order they "
            "will run, within a budget per tier; each copy goes once its last reader finished. enabled "
            "(default auto: on once the shared filesystem proves slow to read; true, false), budget (a size or a share of the tier, default '25%'), lookahead (reader nodes "
            "ahead, default 4)",
            {"enabled": True, "budget": "2GiB", "lookahead": 4},
        ),
    )
    progress: str = field(
        default="auto",
        metadata=_doc(
            "how the run's progress is shown (nodes done of the total, what runs, each tier's fill, what waits to "
            "go home and its rate, an ETA): auto (one updating line on a terminal, else a line every 30 s in the "
            "log), bar, lines or off",
            "lines",
        ),
    )
    default_node_size: int = field(
        default=64 * 2**20,
        metadata=_doc(
            "space reserved for a node whose size cannot be estimated yet (no finished node with the same "
            "interface, no measured inputs)",
            "64MiB",
        ),
    )
    memory_headroom: str = field(
        default="3%",
        metadata=_doc(
            "memory left free when RAM tiers (/dev/shm, a tmpfs $SLURM_TMPDIR) and nodes share the job's memory "
            "(the cgroup limit SLURM sets, else MultiProc's memory_gb, else the machine's): a size ('256MiB') or a "
            "share of the limit ('3%', never less than 32MiB); a directory goes on a RAM tier, and a node starts, "
            "only while what the nodes reserve (their mem_gb), what RAM tiers hold and this headroom fit in it",
            "256MiB",
        ),
    )

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, source: str | os.PathLike[str] | Mapping[str, Any] | None = None) -> SeaConfig:
        """Read a config from a dict, a YAML path, or ``$SEA_CONFIG``; defaults when none is given."""
        if isinstance(source, SeaConfig):
            return source
        if source is None:
            source = os.environ.get(ENV_VAR) or None
            if source is None:
                return cls()
        if isinstance(source, (str, os.PathLike)):
            return cls.from_mapping(read_config_file(Path(source)), origin=str(source))
        if isinstance(source, Mapping):
            return cls.from_mapping(source)
        raise SeaConfigError(
            f"sea config must be a path to a YAML file or a dict, not {type(source).__name__}: "
            "pass plugin_args={'sea': 'sea.yml'} or plugin_args={'sea': {'tiers': [...]}}"
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], origin: str = "sea config") -> SeaConfig:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise SeaConfigError(
                f"{origin}: the top level must be a mapping of keys ({', '.join(cls.keys())}), "
                f"not a {type(data).__name__}"
            )
        close = [key for key in data if difflib.get_close_matches(str(key), cls.keys(), n=1)]
        if data and not close and not any(key in cls.keys() for key in data):  # not a Sea configuration at all: say so, never echo its contents
            raise SeaConfigError(
                f"{origin} is not a Sea configuration: none of its {len(data)} key(s) is one of Sea's ({', '.join(cls.keys())}); "
                "give a YAML file of them, such as tiers: [{path: /dev/shm}]"
            )
        only_known_keys(data, origin, cls.keys())
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            try:
                kwargs[name] = _PARSERS[name](value, f"{origin}: {name}")
            except RecursionError:
                raise SeaConfigError(f"{origin}: {name} is nested too deeply to be a value of it; see docs/configuration.md") from None
        if kwargs.get("keep_intermediates") and kwargs.get("checkpoints", Checkpoints.ALL) is not Checkpoints.ALL:
            raise SeaConfigError(
                f"{origin}: keep_intermediates: true means checkpoints: all, but checkpoints is {kwargs['checkpoints'].value!r}; "
                "remove one of the two keys"
            )
        return cls(**kwargs)

    @property
    def checkpoint_mode(self) -> Checkpoints:
        """``checkpoints``, with ``keep_intermediates: true`` read as ``all``."""
        return Checkpoints.ALL if self.keep_intermediates else self.checkpoints

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def describe(cls) -> list[tuple[str, str, Any, Any]]:
        """(key, doc, default, example) for every key: the source of docs/configuration.md."""
        rows = []
        for f in fields(cls):
            default = f.default if f.default is not MISSING else None
            rows.append((f.name, f.metadata["doc"], default, f.metadata.get("example")))
        return rows


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ------------------------------------------------------------------ checks shared with the adapters
# The wording of every message about a key or a value, for the config and for the adapters' own
# arguments (SeaMultiProc's plugin_args, SeaWorker's n_procs) alike.
def unknown_key(what: str, key: Any, known: list[str], valid: str = "valid keys") -> SeaConfigError:
    """``key`` is not one of ``known``: the error, with the closest known key."""
    return SeaConfigError(f"{what}: unknown key {key!r}{_did_you_mean(str(key), known)}; {valid}: {', '.join(known)}")


def only_known_keys(value: Mapping, what: str, known: list[str]) -> None:
    """Raise :func:`unknown_key`'s error for the first key of ``value`` not in ``known``."""
    for key in value:
        if key not in known:
            raise unknown_key(what, key, known)


def check_bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise SeaConfigError(f"{what} must be true or false, not {value!r}")
    return value


def check_whole_number(value: Any, what: str, low: int = 1, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low or (high is not None and value > high):
        limits = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise SeaConfigError(f"{what} must be a whole number {limits}, not {value!r}")
    return int(value)


def check_positive_number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < float("inf"):
        raise SeaConfigError(f"{what} must be a number greater than 0, not {value!r}")
    return value


def check_choice(value: Any, what: str, choices: list[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise SeaConfigError(f"{what} {value!r} is not one of {', '.join(choices)}{_did_you_mean(str(value), choices)}")
    return value


MIN_CAPACITY = 2**20  # a node directory holds at least its engine's own files: a few KiB to a few hundred


def no_room(where: str, capacity: str) -> SeaConfigError:
    return SeaConfigError(
        f"{where}: capacity {capacity!r} leaves no room for a single node directory (at least 1 MiB); "
        "give a size such as 4GiB or a share such as 80%"
    )


def read_config_file(path: Path) -> Any:
    try:
        is_file, is_dir = path.is_file(), path.is_dir()
    except (OSError, ValueError):  # a name too long, a NUL byte
        is_file = is_dir = False
    if is_dir:
        raise SeaConfigError(f"sea config file {str(path)!r} is a directory: give the path of a YAML file, or a dict")
    if not is_file:
        raise SeaConfigError(
            f"sea config file {str(path)!r} does not exist: give the path of a YAML file, or a dict"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SeaConfigError(f"sea config file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); give a YAML file") from None
    except OSError as exc:
        raise SeaConfigError(f"cannot read the sea config file {str(path)!r} ({exc.strerror}); check its permissions") from None
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise SeaConfigError(f"sea config file {str(path)!r} is nested too deeply to be a Sea configuration; give a YAML file of Sea's keys") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SeaConfigError(f"malformed YAML in {path}{where}: {problem}; fix the syntax (indentation, colons, quotes)") from None
    if data is None:
        raise SeaConfigError(f"sea config file {str(path)!r} is empty: write the tiers (tiers: [{{path: /dev/shm}}]), or give no file to use the tiers Sea finds")
    return data


def check_vars(text: str, what: str) -> str:
    """``text`` if its ``$`` are well formed. Variables are expanded where the tiers are made
    (:func:`expand_vars`), which may be another machine: ``${SLURM_TMPDIR}`` is a compute node's."""
    if not string.Template(text).is_valid():
        raise SeaConfigError(f"{what}: {text!r} has a stray '$'; write ${{VAR}} or $$ for a literal $")
    return text


def expand_vars(text: str, what: str) -> str:
    """``${VAR}`` / ``$VAR`` (and a leading ``~``) expansion that refuses unset variables instead of
    leaving them in a path."""
    try:
        return os.path.expanduser(string.Template(text).substitute(os.environ))  # ~: the user's home directory there
    except KeyError as exc:
        raise SeaConfigError(
            f"{what}: environment variable ${{{exc.args[0]}}} is not set; set it or write the path out"
        ) from None
    except ValueError:
        raise SeaConfigError(f"{what}: {text!r} has a stray '$'; write ${{VAR}} or $$ for a literal $") from None


# --------------------------------------------------------------------- field parsers
def _parse_tiers(value: Any, what: str) -> tuple[TierSpec, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise SeaConfigError(f"{what} must be a non-empty list like [{{path: /dev/shm, capacity: 4GiB}}]")
    tiers = []
    for i, item in enumerate(value):
        where = f"{what}[{i}]"
        if isinstance(item, str):
            item = {"path": item}
        if not isinstance(item, Mapping):
            raise SeaConfigError(f"{where} must be a mapping with 'path' (and optional 'capacity'), not {item!r}")
        for key in item:
            if key not in ("path", "capacity"):
                raise unknown_key(where, key, ["path", "capacity"], valid="a tier has")
        if not isinstance(item.get("path"), str) or not item["path"].strip():
            raise SeaConfigError(f"{where}: 'path' is missing or not a string; write path: /dev/shm")
        if "\0" in item["path"]:
            raise SeaConfigError(f"{where}: 'path' {item['path']!r} contains a NUL character; write the directory's path")
        capacity = item.get("capacity")
        if capacity is not None and is_bare_number(capacity):
            n = str(capacity).strip()
            raise SeaConfigError(f"{where}: capacity {capacity!r} has no unit (it would be {n} bytes); write {n}GiB, {n}GB or 80%")
        if capacity is not None:
            capacity = str(capacity)
            try:
                share = parse_fraction(capacity)
            except ValueError as exc:
                raise SeaConfigError(f"{where}: capacity {exc}") from None
            try:
                size = parse_size(capacity) if share is None else None
            except ValueError as exc:
                raise SeaConfigError(f"{where}: capacity {exc}, or a share like '80%'") from None
            if size is not None and size < MIN_CAPACITY:
                raise no_room(where, capacity)
        tiers.append(TierSpec(path=check_vars(item["path"], f"{where}.path"), capacity=capacity))
    return tuple(tiers)


def _parse_rules(value: Any, what: str) -> tuple[Rule, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SeaConfigError(f"{what} must be a list like [{{pattern: '**/_report/**', mode: copy}}]")
    rules = []
    modes = [m.value for m in Mode]
    for i, item in enumerate(value):
        where = f"{what}[{i}]"
        if not isinstance(item, Mapping) or set(item) != {"pattern", "mode"}:
            raise SeaConfigError(f"{where} must have exactly the keys 'pattern' and 'mode', e.g. {{pattern: '**/*.nii.gz', mode: copy}}; got {item!r}")
        pattern, mode = item["pattern"], item["mode"]
        if not isinstance(pattern, str) or not pattern:
            raise SeaConfigError(f"{where}: pattern must be a non-empty string (a glob, or 're:' + a regex)")
        check_choice(mode, f"{where}: mode", modes)
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as exc:
                raise SeaConfigError(f"{where}: {pattern!r} is not a valid regular expression ({exc}); fix it or use a glob") from None
        rules.append(Rule(pattern=pattern, mode=Mode(mode)))
    return tuple(rules)


def _parse_factor(value: Any, what: str) -> float:
    return float(check_positive_number(value, what))


def _parse_budget(value: Any, what: str) -> str:
    from .checkpoint import Budget

    if is_bare_number(value) and str(value).strip() not in ("0",):
        n = str(value).strip()
        raise SeaConfigError(f"{what}: {value!r} has no unit (it would be {n} bytes); write {n}GiB, {n}GB or a share of the outputs such as '100%'")
    try:
        Budget(str(value)).bytes(2**30)
    except ValueError as exc:
        raise SeaConfigError(f"{what}: {exc}, or a share of what the run delivers such as '100%'") from None
    return str(value).strip()


def _parse_checkpoints(value: Any, what: str) -> Checkpoints:
    if isinstance(value, Checkpoints):
        return value
    return Checkpoints(check_choice(value, what, [c.value for c in Checkpoints]))


def _parse_threads(value: Any, what: str) -> int:
    return check_whole_number(value, what, 1, 64)


def _parse_report(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise SeaConfigError(f"{what} must be a file name such as 'sea-report.json', not {value!r}")
    if Path(value).is_absolute() or ".." in Path(value).parts:
        raise SeaConfigError(
            f"{what} {value!r} would be written outside the home (base_dir); give a path inside it such as "
            "'sea-report.json' or 'reports/sea.json' (copy it elsewhere after the run if you need it there)"
        )
    if Path(value).parts[0] == ".sea":
        raise SeaConfigError(f"{what} {value!r} is inside .sea/, where Sea keeps its journal and records; give another name such as 'sea-report.json'")
    return value


def _parse_sinks(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.isidentifier() for v in value):
        raise SeaConfigError(f"{what} must be a list of interface class names, e.g. [DataSink, DerivativesDataSink], not {value!r}")
    return tuple(value)


def _parse_node_size(value: Any, what: str) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise SeaConfigError(f"{what}: {exc}") from None


MIN_HEADROOM = 32 * 2**20


def headroom_bytes(spec: str, limit: int) -> int:
    """``memory_headroom`` for a job of ``limit`` bytes."""
    fraction = parse_fraction(spec)
    return max(MIN_HEADROOM, int(fraction * limit)) if fraction is not None else parse_size(spec)


def _parse_headroom(value: Any, what: str) -> str:
    if is_bare_number(value):
        raise SeaConfigError(f"{what}: {value!r} has no unit; write a size such as '256MiB' or a share of the job's memory such as '3%'")
    try:
        headroom_bytes(str(value), 2**30)
    except ValueError as exc:
        raise SeaConfigError(f"{what}: {exc}") from None
    return str(value)


AUTO = "auto"  # prefetch: on while the shared filesystem proves slow to read (sea.prefetch)


def _parse_prefetch(value: Any, what: str) -> PrefetchSpec:
    if value is None:
        return PrefetchSpec()
    if isinstance(value, bool) or value == AUTO:  # prefetch: true, or prefetch: auto
        return PrefetchSpec(enabled=value)
    if not isinstance(value, Mapping):
        raise SeaConfigError(f"{what} must be true, false, auto or a mapping like {{enabled: true, budget: 2GiB, lookahead: 4}}, not {value!r}")
    only_known_keys(value, what, [f.name for f in fields(PrefetchSpec)])
    enabled = value.get("enabled", True)
    if not isinstance(enabled, bool) and enabled != AUTO:
        raise SeaConfigError(f"{what}.enabled must be true, false or auto, not {enabled!r}")
    budget = str(value.get("budget", PrefetchSpec.budget))
    try:
        empty = parse_fraction(budget) is None and parse_size(budget) == 0
    except ValueError as exc:
        raise SeaConfigError(f"{what}.budget {exc}, or a share like '25%'") from None
    if empty:
        raise SeaConfigError(f"{what}.budget {budget!r} leaves no room; give a positive size or share, or enabled: false")
    lookahead = check_whole_number(value.get("lookahead", PrefetchSpec.lookahead), f"{what}.lookahead", 1, 1000)
    return PrefetchSpec(enabled=enabled, budget=budget, lookahead=lookahead)


_PARSERS = {
    "tiers": _parse_tiers,
    "rules": _parse_rules,
    "checkpoints": _parse_checkpoints,
    "checkpoint_factor": _parse_factor,
    "checkpoint_budget": _parse_budget,
    "keep_intermediates": check_bool,
    "backpressure": check_bool,
    "logical_paths": check_bool,
    "stager_threads": _parse_threads,
    "report": _parse_report,
    "sinks": _parse_sinks,
    "progress": lambda value, what: check_choice("off" if value is False else value, what, list(MODES)),  # YAML reads `off` as false
    "default_node_size": _parse_node_size,
    "prefetch": _parse_prefetch,
    "memory_headroom": _parse_headroom,
}
assert set(_PARSERS) == set(SeaConfig.keys())
