"""``plugin='SeaMultiProc'`` works in a fresh interpreter without importing nipype_sea, and from an
fMRIPrep-style ``--use-plugin`` YAML file; ``sea`` never imports an engine."""

from __future__ import annotations

import configparser
import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(
    "code, said",
    [
        ("from nipype import Node, Workflow\nfrom nipype.interfaces.utility import IdentityInterface\n"
         "wf = Workflow(name='w', base_dir='work')\nwf.add_nodes([Node(IdentityInterface(fields=['a']), name='n')])\n"
         "wf.run(plugin='SeaMultiproc')", "sea: error: Nipype has no plugin 'SeaMultiproc': Sea's is 'SeaMultiProc'"),
        ("from pydra.engine.submitter import Submitter\nSubmitter(worker='Sea', cache_root='cache')",
         "sea: error: Pydra has no worker 'Sea': Sea's is 'sea'"),
    ],
    ids=["nipype", "pydra"],
)
def test_a_mistyped_sea_plugin_name_ends_in_one_line_naming_the_right_one(disk_dir, code, said):
    """Nipype's traceback ended in "Did you mean: 'MultiProcPlugin'?", Pydra's in a package to
    install; a name that is not near Sea's is still the engine's to answer (issue 35)."""
    if "pydra" in code:
        pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    result = run_fresh(code, cwd=disk_dir)
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [result.stderr.strip()] and result.stderr.startswith(said), result.stderr
    theirs = run_fresh(code.replace("SeaMultiproc", "Multiproc").replace("'Sea'", "'cff'"), cwd=disk_dir)
    assert "Traceback" in theirs.stderr and "sea: error" not in theirs.stderr, theirs.stderr


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


# SeaDask by name from a --use-plugin YAML runs by default on a real SLURM (test_docs'
# test_slurm_use_plugin_yaml_runs_on_slurm); this one adds `cluster: local` (20 s of CPU)
@pytest.mark.slow
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


# a release check (51 s on a slow day: two isolated builds and a venv); README command 2's own
# `pip install .` installs a wheel built from the tree, through which every test finds both plugin names
@pytest.mark.slow
def test_a_wheel_built_from_the_sdist_registers_both_plugin_names(tmp_path):
    """What pip and tox do with a release: build the sdist, then the wheel from it (``python -m
    build``), install the wheel; both ``plugin="SeaMultiProc"`` (the .pth at the top of
    site-packages) and ``worker="sea"`` (pydra/workers/sea.py) must then come from that install."""
    repo = Path(__file__).parents[1]
    # the files a clone has (setuptools would also take those an earlier build's egg-info lists)
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=repo, capture_output=True, check=True).stdout
    root = tmp_path / "clone"
    for name in filter(None, listed.decode().split("\0")):
        if (repo / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, root / name)
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist"), str(root)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert len(list((tmp_path / "dist").glob("*.tar.gz"))) == 1  # the wheel was built from it
    # ready to publish: what PyPI checks of the metadata and the description
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, (tmp_path / "dist").iterdir())], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0 and checked.stdout.count("PASSED") == 2, checked.stdout + checked.stderr
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"sea_workflows.pth", "pydra/workers/sea.py", "nipype_sea/_autoregister.py"} <= names, sorted(names)[:20]

    # the engines from this environment (a venv's, or the system's), sea-workflows from the wheel ahead
    # of this one's: --system-site-packages would give the base interpreter's, not this venv's
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    inner = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True, check=True).stdout.strip()
    Path(inner, "outer-environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)], check=True, timeout=300, capture_output=True)
    code = textwrap.dedent(
        """
        import sys, site
        from nipype.pipeline.plugins import SeaMultiProcPlugin  # put there by the .pth, at start-up
        import nipype_sea
        ours = site.getsitepackages()[0]
        print(nipype_sea.__file__.startswith(ours), SeaMultiProcPlugin.__module__)
        if sys.version_info >= (3, 11):
            from pydra.engine.submitter import Submitter  # noqa: F401 (pydra.workers.base first is a circular import)
            from pydra.workers.base import Worker
            print(Worker.plugin("sea").__module__, sys.modules["pydra.workers.sea"].__file__.startswith(ours))
        """
    )
    code += "import sea; print(sea.__version__)\n"
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # (a test or a developer may set it to the checkout)
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120, env=alone)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split("\n")
    assert lines[0] == "True nipype_sea.plugin", out.stdout
    if sys.version_info >= (3, 11):
        assert lines[1] == "pydra_sea.worker True", out.stdout
    version = configparser.ConfigParser()
    version.read(repo / "setup.cfg")
    assert lines[-2] == version["metadata"]["version"], out.stdout  # one version source: setup.cfg
