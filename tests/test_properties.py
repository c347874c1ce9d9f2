"""Properties of every registry entry (API.md section 2), for every param dtype.

For float16/bfloat16/float32/float64 params, with grads in the params' dtype and in
float32: the state keeps its exact structure/dtypes/shapes/weak types over jitted
updates, updates come back in the params' dtype, counters are int32, the state is a
valid `lax.scan` carry and `lax.cond` branch output, and the jitted step traces once.
"""

import dataclasses

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import pytest

from eqxopt._misc import compute_dtype

from .helpers import avals, case_extra, case_grads, CASES, DTYPES, make_params


GRAD_DTYPES = ["same", "float32"]


def _with_state_dtype(opt, dtype):
    """`opt` with `state_dtype=dtype`, or `None` if it has no such option."""
    if not any(f.name == "state_dtype" for f in dataclasses.fields(opt)):
        return None
    return dataclasses.replace(opt, state_dtype=dtype)


def _expected_float_dtypes(params, state_dtype):
    wanted = {np.dtype(x.dtype) for x in jtu.tree_leaves(params)}
    if state_dtype is not None:
        wanted.add(np.dtype(state_dtype))
    return wanted


def _one_step(opt, grads, state, params, extra):
    updates, state = opt.update(grads, state, params, **extra)
    return updates, state, eqx.apply_updates(params, updates)


def check_state_properties(
    opt,
    case,
    dtype_name,
    grad_dtype,
    state_dtype=None,
    compiled=False,
    control_flow=True,
):
    """Check API.md rules 1-8 for `opt` on `case`'s params in `dtype_name`.

    By default everything is traced abstractly (`eqx.filter_eval_shape`): the types
    are what is under test, and `jit` caches on exactly these avals, so "the state
    comes back with identical avals" is "a jitted step traces once". One update is
    enough: tracing is deterministic in the avals, so a state that comes back with its
    own avals does so at every later step. `control_flow` also traces the update as a
    `lax.scan` body and a `lax.cond` branch. `compiled=True` also runs three real
    jitted steps and counts the traces.
    """
    dtype = DTYPES[dtype_name]
    params = make_params(dtype, case.shapes)
    extra = case_extra(case, params)
    grads = case_grads(
        case, params, jr.key(0), None if grad_dtype == "same" else jnp.float32
    )
    state = eqx.filter_eval_shape(opt.init, params)
    init_avals = avals(state)

    # Counters are int32, flags bool, float buffers mirror the params (or state_dtype).
    # A 0-d float accumulator (e.g. schedule-free's weight sum) may be in the compute
    # dtype (>= float32, never wider than the params' promotion with float32): in
    # bfloat16 a running sum stops growing after ~256 steps.
    floats = _expected_float_dtypes(params, state_dtype)
    scalar_ok = floats | {compute_dtype(*floats)}
    for path, dt, shape, weak in init_avals[1]:
        assert not weak, f"weakly typed state leaf {path}"
        if jnp.issubdtype(dt, jnp.integer):
            assert dt == np.dtype(jnp.int32), f"{path} is {dt}, not int32"
        elif jnp.issubdtype(dt, jnp.floating):
            allowed = scalar_ok if shape == () else floats
            assert dt in allowed, f"{path} is {dt}; params are {floats}"

    # One update: identical state avals, updates in the params' dtypes.
    updates, new_state, _ = eqx.filter_eval_shape(
        _one_step, opt, grads, state, params, extra
    )
    assert avals(new_state) == init_avals
    for u, q in zip(jtu.tree_leaves(updates), jtu.tree_leaves(params)):
        assert u.dtype == q.dtype

    if not control_flow and not compiled:
        return

    # Scan carry and cond branch output (types must match exactly).
    def body(carry, g):
        p, s = carry
        u, s = opt.update(g, s, p, **extra)
        return (eqx.apply_updates(p, u), s), None

    gs = jtu.tree_map(lambda x: jnp.stack([x, x]), grads)
    jax.eval_shape(lambda c: lax.scan(body, c, gs), (params, state))
    jax.eval_shape(
        lambda s, b: lax.cond(
            b, lambda s: opt.update(grads, s, params, **extra)[1], lambda s: s, s
        ),
        state,
        True,
    )

    if compiled:
        traces = 0

        def step(grads, state, params, extra):
            nonlocal traces
            traces += 1
            return opt.update(grads, state, params, **extra)

        jit_step = eqx.filter_jit(step)
        state, key = opt.init(params), jr.key(1)
        for _ in range(3):
            key, sub = jr.split(key)
            grads = case_grads(
                case, params, sub, None if grad_dtype == "same" else jnp.float32
            )
            updates, state = jit_step(grads, state, params, case_extra(case, params))
            assert avals(state) == init_avals
            params = eqx.apply_updates(params, updates)
            assert all(q.dtype == dtype for q in jtu.tree_leaves(params)), (
                "params changed dtype"
            )
        assert traces == 1


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_compiled_step_traces_once(case):
    """Optax 0.2.8's failing setting, run for real: bfloat16 params, float32 grads."""
    check_state_properties(case.make(), case, "bfloat16", "float32", compiled=True)


# float32 params with float32 grads are the "same" case: not run twice.
DTYPE_PAIRS = [
    (d, g) for d in DTYPES for g in GRAD_DTYPES if (d, g) != ("float32", "float32")
]


@pytest.mark.parametrize("dtype_name, grad_dtype", DTYPE_PAIRS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_state_is_stable(case, dtype_name, grad_dtype):
    # `lax.scan`/`lax.cond` are traced once per param dtype (with float32 grads, or
    # for float32 params their own): the exact aval check above already implies them.
    control_flow = grad_dtype == "float32" or dtype_name == "float32"
    check_state_properties(
        case.make(), case, dtype_name, grad_dtype, control_flow=control_flow
    )


@pytest.mark.parametrize("dtype_name", ["bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_state_dtype_float32_buffers(case, dtype_name):
    opt = _with_state_dtype(case.make(), jnp.float32)
    if opt is None:
        pytest.skip("no state_dtype option")
    check_state_properties(
        opt, case, dtype_name, "float32", state_dtype=jnp.float32, control_flow=False
    )


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("case", [c for c in CASES if c.wrappable], ids=lambda c: c.id)
def test_state_is_stable_under_multisteps(case, dtype_name):
    """Every registry optimizer inside `MultiSteps(..., every_k=2)` (its `lax.cond`
    traces both the accumulating and the applying call), float32 grads: the same
    properties."""
    import eqxopt

    opt = eqxopt.MultiSteps(case.make(), every_k=2)
    control_flow = dtype_name == "bfloat16"
    check_state_properties(opt, case, dtype_name, "float32", control_flow=control_flow)
