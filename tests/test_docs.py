"""The documentation's examples run: every ```python block in docs/, and the README's demo."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
BLOCKS = [
    (path.name, i, block)
    for path in sorted((ROOT / "docs").glob("*.md"))
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))
]


@pytest.mark.parametrize("name, index, code", BLOCKS, ids=[f"{n}-{i}" for n, i, _ in BLOCKS])
def test_docs_python_blocks_run(name, index, code, tmp_path):
    script = tmp_path / "example.py"  # Nipype's Function reads the source of its function from a file
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, f"{name} block {index} failed:\n{result.stderr[-2000:]}"
    shutil.rmtree("/tmp/sea-quickstart", ignore_errors=True)


def test_readme_demo_command_prints_the_report(tmp_path):
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^pip install \. && (python -m example_workflows\.incrementation.*)$", readme, re.M).group(1)
    args = command.split()[1:]
    args[args.index("--root") + 1] = str(tmp_path / "demo")
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Sea run succeeded" in result.stdout and "flushed home" in result.stdout


def test_the_documentation_builds_without_a_warning(tmp_path):
    """Sphinx with MyST, as tox's docs environment builds it; a warning (a broken link or
    cross-reference, a page outside the table of contents) fails."""
    pytest.importorskip("myst_parser")
    result = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"), str(tmp_path / "html")],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "html" / "slurm.html").exists()
