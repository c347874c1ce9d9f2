"""dtype rules 2 and 8 without x64 (the rest of the suite runs with x64 on)."""

import os
import subprocess
import sys


def test_registry_state_is_stable_without_x64():
    # One subprocess for the whole registry: a second would import JAX and eqxopt and
    # trace each `jax.numpy` signature again (two halves took 23 CPU-s, one 15).
    env = dict(os.environ, JAX_ENABLE_X64="0")
    script = os.path.join(os.path.dirname(__file__), "_no_x64_check.py")
    result = subprocess.run(
        [sys.executable, script],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert result.stdout.splitlines()[-1].startswith("0 failures")
