import gc
import os
import subprocess
import sys


# Multi-device behaviour is tested on CPU: 8 host devices, set before jax is imported.
# The suite compiles thousands of small programs and runs each a few times, and XLA's
# CPU backend spends most of the suite's time compiling them. Cheaper code generation:
# LLVM without its expensive passes, each program's LLVM module compiled whole (not
# split across threads: with two test workers on two cores the threads only contend),
# and fused kernels emitted by XLA's elemental LLVM emitters instead of its newer MLIR
# fusion emitters (together about 4x faster to compile these programs). XLA's HLO
# passes, which decide fusion, copies and the order of operations, are unchanged; only
# the last bits of some float32 results (matmuls, transcendental functions, fused
# multiply-adds) may differ from the default code generation.
_flags = (
    "--xla_force_host_platform_device_count=8",
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)
# Newer than the others: an XLA that does not know one of them aborts the process, so
# they are tried once in a subprocess (by pytest's main process; its workers inherit
# the result).
_NEW_FLAGS = (
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
)
_PROBED = "EQXOPT_TESTS_XLA_FLAGS_PROBED"


def _xla_knows(flags: str) -> bool:
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    code = "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"
    probe = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
    return probe.returncode == 0


if _PROBED not in os.environ:
    os.environ[_PROBED] = "1"
    if _xla_knows(" ".join(_NEW_FLAGS)):
        _flags += _NEW_FLAGS
    else:
        _flags += tuple(f for f in _NEW_FLAGS if _xla_knows(f))

# LAPACK (`eigh`, QR: SOAP, Shampoo, the reference transcriptions) runs on scipy's
# OpenBLAS, whose threads spin-wait: with two test workers on two cores, one thread
# each is faster. Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
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


# Scheduling: the tests that run scripts in subprocesses take 10-90 s each. They run
# first (pytest-xdist hands out tests in order, alternating between the workers), so
# that the other tests fill in around them instead of one worker finishing alone.
_SLOW_FIRST = (
    "test_multiprocess.py",
    "test_benchmarks.py",
    "test_no_x64.py",
    "test_examples.py",
)


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = item.path.name
        return _SLOW_FIRST.index(name) if name in _SLOW_FIRST else len(_SLOW_FIRST)

    items.sort(key=rank)  # stable: the order within each rank is kept


# Python's garbage collector: a test worker's heap grows to millions of objects (JAX's
# trace, lowering and executable caches, the registry, the jaxprs of every compiled
# function), and each full collection walks all of them: about 8% of a worker's CPU
# time (5.2 of 66 s on tests/test_properties.py in one process, 4.3 s of it in full
# collections). After each test, what survives is moved out of the collector's view
# (`gc.freeze`), after a collection of the young generations (the test's own cyclic
# garbage). Full collections then walk only what was allocated since: on the same
# file 0.3 s of full collections, 1.1 s of collector time in all. The memory that the
# frozen objects' cycles might have released later stays: the same run's peak memory
# did not grow (1.26 GB, against 1.63 GB before).
@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    gc.collect(1)
    gc.freeze()
