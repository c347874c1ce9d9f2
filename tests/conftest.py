import os


# Multi-device behaviour is tested on CPU: 8 host devices, set before jax is imported.
# The suite compiles thousands of small programs and runs each a few times: cheaper
# CPU code generation (LLVM without its expensive passes; XLA's HLO passes, which
# decide fusion, copies and numerics, are unchanged) cuts its time by about a fifth.
_flags = (
    "--xla_force_host_platform_device_count=8",
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)
for _flag in _flags:
    _set = os.environ.get("XLA_FLAGS", "")
    if _flag.split("=")[0] not in _set:
        os.environ["XLA_FLAGS"] = (_set + " " + _flag).strip()

import jax
import jax.random as jr
import pytest


# As equinox/optimistix: x64 on (float64 params are tested in-process; without x64 is
# tested in a subprocess by test_no_x64.py), and strict promotion, so eqxopt never
# relies on implicit dtype promotion.
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture
def getkey():
    keys = iter(jr.split(jr.key(5678), 10_000))
    return lambda: next(keys)
