"""Every example in examples/ runs (with --quick where it has one)."""

import pathlib

import pytest

from .helpers import run_script


ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(example, tmp_path):
    args = [example]
    text = example.read_text()
    if "--quick" in text:
        args.append("--quick")
    if "--out" in text:
        args += ["--out", tmp_path / (example.stem + ".png")]
    run_script(args, cwd=tmp_path)
