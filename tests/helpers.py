"""Shared test helpers and THE registry of optimizers (from tests/registry/)."""

import functools
import importlib
import os
import pkgutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np

import eqxopt


DTYPES = {
    "float16": jnp.float16,
    "bfloat16": jnp.bfloat16,
    "float32": jnp.float32,
    "float64": jnp.float64,
}

# Leaf shapes of the default param tree: a matrix, a vector, a 3-D tensor, a scalar.
SHAPES = {"linear": {"weight": (5, 3), "bias": (5,)}, "conv": (2, 3, 4), "scale": ()}


class Case(NamedTuple):
    """One registry entry. Adding an optimizer to the test suite = adding a Case.

    - `make`: builds the eqxopt optimizer (called inside `jit` by some tests).
    - `reference`: builds the Optax transformation it must match, or `None`.
    - `rtol`, `atol`: parity tolerances in float32 (float64: `rtol64`, `atol64`).
    - `shapes`: the param tree's leaf shapes (default `SHAPES`).
    - `extra`: `params -> dict` of extra `update` arguments (e.g. `value_fn`); use
      module-level functions in it, so a jitted step does not retrace.
    - `loss`: `params -> scalar`. If given, grads are `jax.grad(loss)(params)` (at
      float32 for low-precision params) instead of random normals.
    - `wrappable`: include it in wrapper-based property tests (e.g. MultiSteps).
    - `bad`: `(make_bad, field)` pairs: `make_bad()` must raise a `ValueError` whose
      message names `field` (design.md#protocol).
    - `optax_fn`: the Optax function of the same name, as a dotted path under `optax`
      (`"adam"`, `"contrib.dog"`): the constructor's positional parameters must follow
      its order (`state_dtype` stands for `mu_dtype` / `accumulator_dtype`).
    """

    id: str
    make: Callable[[], eqxopt.AbstractOptimizer]
    reference: Callable[[], Any] | None = None
    rtol: float = 1e-6
    rtol64: float = 1e-10
    atol: float = 1e-7
    atol64: float = 1e-13
    steps: int = 10
    shapes: Any = None
    extra: Callable[[Any], dict] | None = None
    loss: Callable[[Any], Any] | None = None
    wrappable: bool = True
    bad: tuple[tuple[Callable[[], Any], str], ...] = ()
    optax_fn: str | None = None


def is_matrix(p) -> bool:
    """A per-leaf mask for the registry's cases: the leaves with two or more axes."""
    return p.ndim > 1


def ndim2_mask(params):
    """The same mask as a tree of bools, for cases that take a mask tree."""
    return jax.tree.map(is_matrix, params)


def _collect() -> tuple[Case, ...]:
    from . import registry

    cases = []
    for info in sorted(pkgutil.iter_modules(registry.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{registry.__name__}.{info.name}")
        cases.extend(module.CASES)
    ids = [c.id for c in cases]
    duplicated = {i for i in ids if ids.count(i) > 1}
    assert not duplicated, f"duplicate registry ids: {duplicated}"
    return tuple(cases)


CASES = _collect()
PARITY_CASES = tuple(c for c in CASES if c.reference is not None)


def make_params(dtype=jnp.float32, shapes=None, key=None):
    key = jr.key(0) if key is None else key
    shapes = SHAPES if shapes is None else shapes
    leaves, treedef = jtu.tree_flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
    keys = jr.split(key, len(leaves))
    arrays = [jr.normal(k, s, jnp.float32).astype(dtype) for k, s in zip(keys, leaves)]
    return jtu.tree_unflatten(treedef, arrays)


def random_like(key, tree, dtype=None):
    leaves, treedef = jtu.tree_flatten(tree)
    keys = jr.split(key, len(leaves))
    out = [
        jr.normal(k, x.shape, jnp.float32).astype(dtype or x.dtype)
        for k, x in zip(keys, leaves)
    ]
    return jtu.tree_unflatten(treedef, out)


def tree_allclose(x, y, *, rtol=1e-5, atol=1e-8):
    return eqx.tree_equal(x, y, typematch=True, rtol=rtol, atol=atol)


def avals(tree):
    """(structure, [(path, dtype, shape, weak_type)]): for exact comparisons."""
    leaves, treedef = jtu.tree_flatten_with_path(tree)
    return treedef, [
        (
            jtu.keystr(p),
            np.dtype(x.dtype),
            tuple(x.shape),
            bool(
                getattr(
                    jax.typeof(x) if isinstance(x, jax.Array) else x, "weak_type", False
                )
            ),
        )
        for p, x in leaves
    ]


@functools.cache
def compiled(fn: Callable) -> Callable:
    """`eqx.filter_jit(fn)`, one per function: every call after the first per input
    signature runs one compiled program instead of dispatching `fn`'s operations one
    by one."""
    return eqx.filter_jit(fn)


@functools.cache
def _grad(loss: Callable) -> Callable:
    # Taken eagerly, a registry loss's gradient is traced op by op again at every
    # call (about 40 ms, thousands of times in the suite).
    return compiled(jax.grad(loss))


def case_grads(case: Case, params, key, dtype=None):
    """The grads a test feeds `case`: random normals, or the gradient of `case.loss`.
    `dtype` overrides the grads' dtype (e.g. float32 grads for bfloat16 params)."""
    if case.loss is None:
        return random_like(key, params, dtype)
    grads = _grad(case.loss)(params)
    return jtu.tree_map(lambda g: g.astype(dtype or g.dtype), grads)


def case_extra(case: Case, params) -> dict:
    """The extra `update` arguments of `case` at `params` (values, gradients and
    functions: see `Case.extra`), computed by one compiled program."""
    return {} if case.extra is None else compiled(case.extra)(params)


def subprocess_env(devices: int | None = None) -> dict[str, str]:
    """The environment of a script the suite runs in a subprocess (an example, a
    benchmark's `--quick` mode, a multi-process worker): the suite's cheap CPU code
    generation (it leaves numerics unchanged; see conftest.py), `devices` host CPU
    devices (default: JAX's, one), one OpenBLAS thread, x64 off, matplotlib's Agg."""
    env = dict(os.environ, MPLBACKEND="Agg", JAX_PLATFORMS="cpu")
    env["OPENBLAS_NUM_THREADS"] = "1"
    flags = [
        flag
        for flag in env.get("XLA_FLAGS", "").split()
        if not flag.startswith("--xla_force_host_platform_device_count")
    ]
    if devices is not None:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    env["XLA_FLAGS"] = " ".join(flags)
    env.pop("JAX_ENABLE_X64", None)
    env.pop("EQXOPT_CHECK_STATE", None)
    return env


def run_script(args, cwd, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run a Python script (`args`: its path and arguments) in a subprocess with
    `subprocess_env()`; fails with the end of its output unless it exits 0."""
    result = subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=cwd,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result
