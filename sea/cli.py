"""The ``sea`` command: check a configuration, print a run's report, print the config reference.

Errors in a configuration print as one line, without a traceback, and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.metadata
import json
import os
import sys
from pathlib import Path

from .config import SeaConfig, SeaConfigError, expand_vars, read_config_file
from .engine import HISTORY, JOURNAL
from .estimate import SizeEstimator
from .graph import WorkflowGraph
from .journal import Journal
from .model import Bandwidth, TierModel
from .plan import Plan, describe, load_target, make_plan
from .plot import plot_timeline
from .probe import cache_file as probe_cache
from .probe import cached_probe, probe_or_recall
from .recover import kept_directories, recover
from .report import RunReport, runs
from .resume import CACHE_CHECK, CHANGED, EVICTED, plan_rerun
from .sizes import format_size
from .tiers import StorageHierarchy, check_is_directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sea", description="Sea for workflows: data placement for Nipype and Pydra")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="check a configuration (and its tiers against a home) without running anything")
    check.add_argument("config", nargs="?", help="YAML file (default: $SEA_CONFIG, else the discovered tiers)")
    check.add_argument("--home", help="the workflow's base_dir; with it, tiers are checked for real")
    report = sub.add_parser("report", help="print the end-of-run report of a run (the latest, or one of those --list shows)")
    report.add_argument("path", help="the base_dir (or cache_root) of the runs, or a report's JSON file")
    report.add_argument("--list", action="store_true", help="list every run's report kept in that base_dir, oldest first")
    report.add_argument("--run", type=int, metavar="N", help="the report of run N of --list (1 is the oldest, -1 the latest)")
    report.add_argument("--json", action="store_true", help="print the JSON as is")
    report.add_argument("--plot", metavar="PNG", help="also draw tier usage and stager queue over time (needs matplotlib: pip install matplotlib)")
    sub.add_parser("config-docs", help="print the configuration reference (docs/configuration.md) in Markdown")
    rescue = sub.add_parser("recover", help="copy home what a run kept on a tier after its flush failed (see the report's KEPT lines)")
    rescue.add_argument("paths", nargs="+", metavar="DIR", help="a kept sea-* directory, or a tier root holding some")
    probe = sub.add_parser("probe", help="measure the read/write bandwidth of directories (cached per host)")
    probe.add_argument("paths", nargs="+", metavar="DIR", help="a directory you can write to (a tier, the shared filesystem)")
    probe.add_argument("--fresh", action="store_true", help="measure again instead of using the cache")
    plan = sub.add_parser("plan", help="predict a workflow's tier usage and makespan before running it")
    plan.add_argument("target", help="MODULE:FUNCTION (or file.py:FUNCTION) returning the workflow")
    plan.add_argument("--sea", help="Sea config (YAML); default $SEA_CONFIG, else the discovered tiers")
    plan.add_argument("--n-procs", type=int, default=os.cpu_count() or 1, help="processes the run will use (default: this machine's cores)")
    plan.add_argument("--shared-read-mbps", type=float, help="the shared filesystem's read bandwidth (default: probe the home)")
    plan.add_argument("--shared-write-mbps", type=float, help="the shared filesystem's write bandwidth (default: probe the home)")
    plan.add_argument("--rerun", action="store_true", help="instead: what a rerun of it in its base_dir will execute, and why (reads the journal)")
    args = parser.parse_args(argv)
    try:
        return _command(args)
    except SeaConfigError as exc:
        for line in getattr(exc, "lines", None) or [str(exc)]:  # one per problem (sea check of a --use-plugin file)
            print(f"sea: error: {line}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `sea report ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit must not fail again
        return 0


def _command(args: argparse.Namespace) -> int:
    if args.command == "check":
        return _check(args.config, args.home)
    if args.command == "probe":
        for path in args.paths:
            print(_probe(Path(path), args.fresh))
        return 0
    if args.command == "recover":
        for path in args.paths:
            for directory in kept_directories(Path(path)):
                try:
                    print(recover(directory).to_text())
                except OSError as exc:  # the home still full, or unreachable: nothing is lost, try again later
                    print(f"sea: error: {directory}: {exc.strerror or exc} ({exc.filename}); what is not home yet stays there", file=sys.stderr)
                    return 1
        return 0
    if args.command == "plan":
        print(_rerun_plan(args) if args.rerun else _plan(args).to_text())
        return 0
    if args.command == "report":
        return _report(args)
    sys.stdout.write(config_reference())
    return 0


def _probe(path: Path, fresh: bool) -> str:
    if not path.is_dir():
        raise SeaConfigError(f"{path} is not a directory: give a directory on the storage to measure (a tier, the shared filesystem)")
    try:
        bw, recalled = probe_or_recall(path, fresh)
    except OSError as exc:
        raise SeaConfigError(f"{path}: cannot write a test file there ({exc.strerror or exc}); give a directory you can write to") from None
    said = f" (measured earlier on this host; --fresh measures again; figures kept in {probe_cache()})" if recalled else ""
    return f"{path}: read {bw.read / 2**20:.0f} MiB/s, write {bw.write / 2**20:.0f} MiB/s{said}"


def _read_report(path: Path) -> RunReport:
    try:
        report = RunReport.from_json(path)
        report.to_text(), report.one_line()  # a field of another kind (edited, or not Sea's) shows here
        return report
    except (OSError, ValueError, TypeError, KeyError, AttributeError, ArithmeticError, IndexError) as exc:
        raise SeaConfigError(f"{path} is not a Sea run report ({type(exc).__name__}: {exc}); give the sea-report.json of a run, or its base_dir") from None


def _report(args: argparse.Namespace) -> int:
    path = Path(args.path)
    kept = runs(path) if path.is_dir() else []
    if args.list:
        if not kept:
            raise SeaConfigError(f"no run reports kept in {path}: give the base_dir (or cache_root) of a run of Sea")
        for i, run in enumerate(kept, 1):
            print(f"{i:>3}  {_read_report(run).one_line()}")
        return 0
    if args.run is not None:
        if not kept or not (1 <= args.run <= len(kept) or -len(kept) <= args.run <= -1):
            raise SeaConfigError(f"no run {args.run} in {path}: `sea report {path} --list` lists its {len(kept)} run(s)")
        path = kept[args.run - 1 if args.run > 0 else args.run]
    elif path.is_dir():
        path = path / "sea-report.json" if (path / "sea-report.json").is_file() or not kept else kept[-1]
    if not path.is_file():
        raise SeaConfigError(f"no report at {path}: give the sea-report.json of a run, or its base_dir")
    report = _read_report(path)
    print(path.read_text() if args.json else report.to_text())
    if len(kept) > 1 and not args.json and args.run is None:
        print(f"({len(kept)} runs kept in {args.path}: `sea report {args.path} --list` lists them, `--run N` shows one)")
    if args.plot:
        plot_timeline(report, Path(args.plot))
        print(f"tier usage over time: {args.plot}")
    return 0


def _check(source: str | None, home: str | None) -> int:
    config = _load_checked(source)
    if home is None:
        for i, spec in enumerate(config.tiers or ()):
            try:
                path = expand_vars(spec.path, f"tiers[{i}].path")
            except SeaConfigError:  # a variable of the machine the run will be on (${SLURM_TMPDIR})
                continue
            check_is_directory(dataclasses.replace(spec, path=path), f"tiers[{i}]")
        print(f"configuration OK ({len(config.tiers or ())} tiers listed, {len(config.rules)} rules); add --home DIR to check the tiers against it")
        return 0
    hierarchy = StorageHierarchy.build(config, Path(home))
    try:
        print("configuration OK; tiers, fastest first:")
        for tier in hierarchy.fast_tiers:
            cap = f", capacity {format_size(tier.capacity)}" if tier.capacity is not None else ""
            print(f"  {tier.root}: {format_size(tier.free_space())} free{cap}")
        print(f"  home {hierarchy.home.root} (the last tier)")
    finally:
        hierarchy.close()
    return 0


def _load_checked(source: str | None) -> SeaConfig:
    """Sea's configuration in ``source``: a Sea YAML file, or a ``--use-plugin`` file as fMRIPrep
    reads it (``plugin:`` and ``plugin_args:``, Sea's settings under ``plugin_args: {sea: ...}``),
    checked whole: the plugin's name, its arguments (by the adapter that provides it: the
    ``sea.plugins`` entry points) and Sea's part; every problem found is one line of the error."""
    if source is None or not Path(source).is_file():
        return SeaConfig.load(source)  # $SEA_CONFIG, defaults, or the one-line error for the path
    data = read_config_file(Path(source))
    if not (isinstance(data, dict) and "plugin" in data and set(data) <= {"plugin", "plugin_args"}):
        return SeaConfig.from_mapping(data, origin=str(source))
    plugin_args = data.get("plugin_args") or {}
    if not isinstance(plugin_args, dict):
        raise SeaConfigError(f"{source}: plugin_args must be a mapping (n_procs, sea, ...), not {plugin_args!r}")
    problems = [f"{source}: {problem}" for problem in _plugin_problems(data["plugin"], plugin_args)]
    sea = plugin_args.get("sea")
    try:
        config = SeaConfig.from_mapping(sea, origin=f"{source}: plugin_args.sea") if isinstance(sea, dict) else SeaConfig.load(sea)
    except SeaConfigError as problem:  # (a path to Sea's own file, or none: $SEA_CONFIG, else the tiers Sea finds)
        problems.append(str(problem))
    if problems:
        error = SeaConfigError(problems[0])
        error.lines = [str(SeaConfigError(problem)) for problem in problems]
        raise error
    return config


def _plugin_problems(plugin: object, plugin_args: dict) -> list[str]:
    """What is wrong with a ``--use-plugin`` file's ``plugin`` and, for a Sea plugin, its
    ``plugin_args`` (as the adapter providing the plugin checks them)."""
    plugins = {entry.name: entry for entry in importlib.metadata.entry_points(group="sea.plugins")}
    if not isinstance(plugin, str):
        return [f"plugin must be a plugin's name, such as SeaMultiProc, not {plugin!r}"]
    if plugin in plugins:
        return plugins[plugin].load()(plugin_args)
    close = [name for name in plugins if name.lower() == str(plugin).lower()] or difflib.get_close_matches(str(plugin), list(plugins), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f": with it, plugin_args.sea is ignored; Sea's are {', '.join(sorted(plugins))}"
    return [f"plugin {plugin!r} is not a Sea plugin{hint}"]


def _plan(args: argparse.Namespace) -> Plan:
    config = SeaConfig.load(args.sea)
    found = describe(load_target(args.target), config)
    hierarchy = StorageHierarchy.build(config, found.home)
    try:
        tiers = [
            TierModel(str(t.root), min(t.free_space(), t.capacity or float("inf")), _measured(t.root, "choose tiers you may write in"))
            for t in hierarchy.fast_tiers
        ]
    finally:
        hierarchy.close()
    existing = next(p for p in [found.home, *found.home.parents] if p.is_dir())  # before the first run
    given = Bandwidth(read=(args.shared_read_mbps or 0) * 1e6, write=(args.shared_write_mbps or 0) * 1e6)
    shared = given if given.read and given.write else _measured(existing, "give --shared-read-mbps and --shared-write-mbps instead")
    shared = Bandwidth(read=given.read or shared.read, write=given.write or shared.write)
    history_path = found.home / HISTORY
    history = SizeEstimator.load(history_path, config.default_node_size)
    graph = WorkflowGraph.from_specs(found.specs)
    return make_plan(
        graph, history, tiers, shared, args.n_procs, found.input_bytes,
        learned=history_path.is_file(), poll_seconds=found.poll_seconds, prefetch=config.prefetch.enabled, config=config,
    )  # fmt: skip


def _measured(directory: Path, fix: str) -> Bandwidth:
    """:func:`cached_probe` of ``directory``; one line where it cannot write there (another user's
    work directory, read-only to this one), with the ``fix``."""
    try:
        return cached_probe(directory)
    except OSError as error:
        raise SeaConfigError(
            f"cannot measure the bandwidth of {str(directory)!r} ({error.strerror or error}): the plan writes a test file "
            f"there; {fix}, or plan as a user who may write there"
        ) from None


def _rerun_plan(args: argparse.Namespace, shown: int = 12) -> str:
    """What a rerun will execute and why, from the journal and the home, before anything runs."""
    found = describe(load_target(args.target), SeaConfig.load(args.sea))
    graph = WorkflowGraph.from_specs(found.specs)
    records = Journal.read(found.home / JOURNAL)
    plan = plan_rerun(graph, records, found.home)
    lines = [f"a rerun in {found.home} ({len(graph)} nodes; the journal knows {len(records)}): {plan.summary()}"]
    groups = {
        CHANGED: "runs: new, or its inputs, code or input data changed",
        EVICTED: "runs again: evicted, and a node that runs needs it",
        CACHE_CHECK: "a directory in the home Sea did not record: Nipype's own cache check decides, as under MultiProc",
    }
    for status, title in groups.items():
        keys = [key for key in graph.topological() if plan.status[key] == status]
        if not keys:
            continue
        lines.append(f"  {len(keys)} {title}:")
        lines += [f"    {key}" + (f" (needed by {plan.needed_by[key]})" if status == EVICTED else "") for key in keys[:shown]]
        if len(keys) > shown:
            lines.append(f"    ... and {len(keys) - shown} more")
    return "\n".join(lines)


def config_reference() -> str:
    """The configuration reference, generated from the fields of :class:`SeaConfig`."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- generated by `sea config-docs` from sea/config.py; tests/test_cli.py keeps it in sync -->",
        "",
        "Sea reads its configuration from `plugin_args['sea']` (a path to a YAML file, or a dict with the",
        "same keys), else from the file named by `$SEA_CONFIG`, else it uses the defaults below.",
        "Every key is optional. A problem is reported as one line naming the key and the fix,",
        "before any node runs (`SeaConfigError`); `sea check FILE --home BASE_DIR` checks a file alone.",
        "",
    ]
    for key, doc, default, example in SeaConfig.describe():
        lines += [f"## `{key}`", "", doc[0].upper() + doc[1:].rstrip(".") + ".", ""]
        shown = list(default) if isinstance(default, tuple) else dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default
        if key == "default_node_size":
            shown = format_size(default)
        lines += [f"Default: `{json.dumps(shown)}`", "", "```yaml", _yaml_line(key, example), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def _yaml_line(key: str, example: object) -> str:
    import yaml

    return yaml.safe_dump({key: example}, default_flow_style=None, sort_keys=False).rstrip()


if __name__ == "__main__":
    raise SystemExit(main())
