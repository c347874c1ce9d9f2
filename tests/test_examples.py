"""Every example in examples/ runs (with --quick where it has one)."""

import pathlib
import subprocess
import sys

import pytest

from .helpers import subprocess_env


ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(example, tmp_path):
    args = [sys.executable, str(example)]
    text = example.read_text()
    if "--quick" in text:
        args.append("--quick")
    if "--out" in text:
        args += ["--out", str(tmp_path / (example.stem + ".png"))]
    result = subprocess.run(
        args,
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
