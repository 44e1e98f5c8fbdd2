"""``plugin='SeaMultiProc'`` works in a fresh interpreter without importing nipype_sea, and from an
fMRIPrep-style ``--use-plugin`` YAML file; ``sea`` never imports an engine."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).parent


def run_fresh(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """A new interpreter, as a user's script; only the test workflows are put on sys.path."""
    prelude = f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, cwd=cwd)


def test_plugin_name_resolves_without_import(disk_dir, shm_dir):
    result = run_fresh(
        f"""
        from pathlib import Path
        from nipype_workflows import build_full, make_subjects
        root = Path({str(disk_dir)!r})
        wf = build_full(root / "data", make_subjects(root / "data", 1, 0.5), root / "work", root / "out")
        assert "nipype_sea.plugin" not in sys.modules
        wf.run(plugin="SeaMultiProc", plugin_args={{"n_procs": 2, "sea": {{"tiers": [{{"path": {str(shm_dir)!r}}}]}}}})
        print("plugin class:", type(wf).__module__, sys.modules["nipype_sea.plugin"].SeaMultiProcPlugin.__mro__[1].__name__)
        """,
        cwd=disk_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "plugin class:" in result.stdout
    assert (disk_dir / "work" / "sea-report.json").is_file()
    assert (disk_dir / "out" / "group" / "group_mean.nii").is_file()


def test_fmriprep_style_use_plugin_yaml(disk_dir, shm_dir):
    """fMRIPrep reads --use-plugin with yaml.safe_load and calls workflow.run(**that)."""
    (disk_dir / "plugin.yml").write_text(
        textwrap.dedent(
            f"""\
            plugin: SeaMultiProc
            plugin_args:
              n_procs: 2
              memory_gb: 4
              maxtasksperchild: 1
              raise_insufficient: false
              sea:
                tiers:
                  - path: {shm_dir}
                stager_threads: 2
            """
        )
    )
    result = run_fresh(
        f"""
        import yaml
        from pathlib import Path
        from nipype_workflows import build_full, make_subjects
        root = Path({str(disk_dir)!r})
        wf = build_full(root / "data", make_subjects(root / "data", 1, 0.5), root / "work", root / "out")
        wf.config["execution"]["stop_on_first_crash"] = True
        wf.config["execution"]["remove_unnecessary_outputs"] = True
        with open(root / "plugin.yml") as fh:
            plugin_settings = yaml.safe_load(fh)
        wf.run(**plugin_settings)
        """,
        cwd=disk_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (disk_dir / "out" / "group" / "group_mean.nii").is_file()


def test_nipype_config_execution_plugin_and_sea_config_env(disk_dir, shm_dir):
    (disk_dir / "sea.yml").write_text(f"tiers:\n  - path: {shm_dir}\nreport: from-env.json\n")
    result = run_fresh(
        f"""
        import os
        os.environ["SEA_CONFIG"] = {str(disk_dir / "sea.yml")!r}
        from pathlib import Path
        from nipype import config
        from nipype_workflows import build_full, make_subjects
        config.set("execution", "plugin", "SeaMultiProc")
        root = Path({str(disk_dir)!r})
        wf = build_full(root / "data", make_subjects(root / "data", 1, 0.5), root / "work", root / "out")
        wf.run()
        """,
        cwd=disk_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (disk_dir / "work" / "from-env.json").is_file()


def test_core_imports_no_engine():
    code = "import sea, sea.cli, sys; bad = [m for m in sys.modules if m.split('.')[0] in ('nipype', 'pydra')]; print(bad); sys.exit(1 if bad else 0)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_core_sources_do_not_mention_engines():
    root = Path(__file__).parents[1] / "sea"
    for path in root.glob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith(("import ", "from ")):
                assert "nipype" not in stripped and "pydra" not in stripped, f"{path.name}: {line}"


def test_seadask_by_name_from_a_use_plugin_yaml_on_a_local_cluster(disk_dir, shm_dir):
    """``plugin: SeaDask`` from YAML, no import of nipype_sea: a local Dask cluster is started and stopped."""
    (disk_dir / "plugin.yml").write_text(
        textwrap.dedent(
            f"""\
            plugin: SeaDask
            plugin_args:
              dask: {{cluster: local, n_workers: 2}}
              sea:
                tiers:
                  - path: {shm_dir}
            """
        )
    )
    result = run_fresh(
        f"""
        import yaml
        from pathlib import Path
        from nipype_workflows import build_full, make_subjects
        if __name__ == "__main__":
            root = Path({str(disk_dir)!r})
            wf = build_full(root / "data", make_subjects(root / "data", 2, 0.5), root / "work", root / "out")
            wf.config["execution"]["poll_sleep_duration"] = 0.05
            assert "nipype_sea.dask_plugin" not in sys.modules
            wf.run(**yaml.safe_load((root / "plugin.yml").read_text()))
        """,
        cwd=disk_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = (disk_dir / "work" / "sea-report.json").read_text()
    assert '"workers"' in report and (disk_dir / "out" / "group" / "group_mean.nii").is_file()
    assert not list(shm_dir.glob("sea-*")), "a worker left its tier directory"
