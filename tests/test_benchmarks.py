"""Smoke test: every script in benchmarks/ runs in its `--quick` mode (no thresholds:
the figures are benchmark results, not tests), and the helpers its reports rest on
find what they should."""

import json
import pathlib
import sys

import pytest

from .helpers import run_script


ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted(
    p for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_")
)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_quick(script, tmp_path):
    args = [script, "--quick"]
    if script.name == "update.py":
        args += ["--json", str(tmp_path / "update.json"), "--plot"]
        args += ["--plot-dir", str(tmp_path)]
    if script.name == "lm.py":
        args += ["--json", str(tmp_path / "lm.json"), "--plot"]
        args += ["--plot-path", str(tmp_path / "bench_lm.png")]
    result = run_script(args, cwd=tmp_path)
    if script.name == "update.py":
        results = json.loads((tmp_path / "update.json").read_text())
        entries = results["sizes"]["1M"]["entries"]
        assert "adamw" in entries
        for kind in ("tree", "flat"):
            run = entries["adamw"][kind]
            assert run["ours"]["median"] > 0 and run["optax"]["median"] > 0
            assert run["ours"]["memory"]["peak"] > 0
        assert (tmp_path / "bench_step_ratio.png").stat().st_size > 0
        assert "Targets" in result.stdout
    if script.name == "lm.py":
        results = json.loads((tmp_path / "lm.json").read_text())
        summary = results["summary"]
        names = ["adamw", "muon", "normuon", "soap", "shampoo", "kron"]
        assert list(summary) == names
        # One learning rate each in quick mode; AdamW learns (the initial loss is
        # about ln 256 = 5.5 nats per byte) and nothing diverges.
        assert len(results["runs"]) == len(names)
        adamw = next(r for r in results["runs"] if r["optimizer"] == "adamw")
        assert adamw["final"] < adamw["curve"][0][1] - 0.3
        for name in names:
            s = summary[name]
            assert 0 < s["final"] < 8 and s["step_ms"] > 0
            assert s["state_bytes"] > 0
        # State sizes follow from the algorithms: Muon keeps one buffer per hidden
        # matrix where AdamW keeps two; SOAP adds factors and bases to AdamW's two.
        assert summary["adamw"]["state_ratio"] == 1
        assert summary["muon"]["state_ratio"] < 1 < summary["soap"]["state_ratio"]
        assert results["muon_eqxopt_over_optax"] > 0
        assert "steps to AdamW's loss" in result.stdout
        assert (tmp_path / "bench_lm.png").stat().st_size > 0


def test_param_sized_copies_finds_copies():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _common  # pyright: ignore[reportMissingImports]  # benchmarks/, above
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    hlo = """HloModule m
%fused_computation (param_0: f32[4096]) -> f32[4096] {
  %param_0 = f32[4096]{0} parameter(0)
  ROOT %copy.9 = f32[4096]{0} copy(%param_0)
}
ENTRY %main (a: f32[4096], b: f32[8]) -> (f32[4096], f32[8]) {
  %a = f32[4096]{0} parameter(0)
  %b = f32[8]{0} parameter(1)
  %copy.1 = f32[4096]{0} copy(%a)
  %copy.2 = f32[8]{0} copy(%b)
  %fusion = f32[4096]{0} fusion(%copy.1), kind=kLoop, calls=%fused_computation
  ROOT %t = (f32[4096]{0}, f32[8]{0}) tuple(%fusion, %copy.2)
}
"""
    # The entry's copy of a param-sized buffer is found; the one inside the fusion
    # body and the copy of a tiny buffer are not.
    assert _common.param_sized_copies(hlo, [(4096,), (8,)]) == ["copy.1: f32[4096]"]
    assert _common.param_sized_copies(hlo, [(8,)]) == []
