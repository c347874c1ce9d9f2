"""Properties of every registry entry (design.md#dtype-rules), for every param dtype.

For float16/bfloat16/float32/float64 params, with grads in the params' dtype and in
float32: the state keeps its exact structure/dtypes/shapes/weak types over jitted
updates, updates come back in the params' dtype, counters are int32, the state is a
valid `lax.scan` carry and `lax.cond` branch output, and the jitted step traces once.
"""

import dataclasses
import io

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import pytest

import eqxopt
from eqxopt._misc import compute_dtype

from .helpers import (
    avals,
    case_extra,
    case_grads,
    CASES,
    DTYPES,
    make_params,
    SHAPES,
)


GRAD_DTYPES = ["same", "float32"]


def _with_state_dtype(opt, dtype):
    """`opt` with `state_dtype=dtype`, or `None` if it has no such option."""
    if not any(f.name == "state_dtype" for f in dataclasses.fields(opt)):
        return None
    return dataclasses.replace(opt, state_dtype=dtype)


def _expected_float_dtypes(params, state_dtype):
    wanted = {np.dtype(x.dtype) for x in jtu.tree_leaves(params)}
    if state_dtype is not None and not isinstance(state_dtype, eqxopt.Quantized):
        wanted.add(np.dtype(state_dtype))
    return wanted


def _quantized_paths(state, params, state_dtype) -> set[str]:
    """Check every quantized buffer of `state` (`eqxopt.QuantizedArray`) against the
    `eqxopt.Quantized` it was asked for and the param it mirrors: uint8 codes of
    `[blocks, block_size]` (int4: half as wide), float32 scales of `[blocks]`. Returns
    the paths of their leaves (their dtypes are checked here, not as params')."""
    nodes = jtu.tree_flatten_with_path(
        state, is_leaf=lambda x: isinstance(x, eqxopt.QuantizedArray)
    )[0]
    nodes = [
        (jtu.keystr(p), q) for p, q in nodes if isinstance(q, eqxopt.QuantizedArray)
    ]
    if not isinstance(state_dtype, eqxopt.Quantized):
        assert not nodes, f"quantized buffers {[p for p, _ in nodes]} not asked for"
        return set()
    assert nodes, f"state_dtype={state_dtype} quantized no buffer"
    shapes = [
        (jtu.keystr(p), x.shape) for p, x in jtu.tree_flatten_with_path(params)[0]
    ]
    out = set()
    for where, q in nodes:
        assert any(where.endswith(p) and q.shape == s for p, s in shapes), where
        blocks = -(-q.size // state_dtype.block)
        width = state_dtype.block // (2 if state_dtype.format == "int4" else 1)
        assert q.format == state_dtype.format, where
        assert (np.dtype(q.codes.dtype), q.codes.shape) == (
            np.dtype(jnp.uint8),
            (blocks, width),
        ), f"{where}.codes is {q.codes.dtype}{list(q.codes.shape)}"
        assert (np.dtype(q.scales.dtype), q.scales.shape) == (
            np.dtype(jnp.float32),
            (blocks,),
        ), f"{where}.scales is {q.scales.dtype}{list(q.scales.shape)}"
        out |= {where + ".codes", where + ".scales"}
    return out


def _scan_of_cond_step(opt, grads, state, params, extra):
    def body(carry, g):
        p, s, flag = carry
        u, new = opt.update(g, s, p, **extra)
        s = lax.cond(flag, lambda: new, lambda: s)
        return (eqx.apply_updates(p, u), s, flag), u

    gs = jtu.tree_map(lambda x: jnp.stack([x, x]), grads)
    (_, state, _), updates = lax.scan(body, (params, state, jnp.array(True)), gs)
    return jtu.tree_map(lambda u: u[0], updates), state


def check_state_properties(
    opt,
    case,
    dtype_name,
    grad_dtype,
    state_dtype=None,
    compiled=False,
):
    """Check dtype rules 1-8 for `opt` on `case`'s params in `dtype_name`.

    By default everything is traced abstractly (`eqx.filter_eval_shape`): the types
    are what is under test, and `jit` caches on exactly these avals, so "the state
    comes back with identical avals" is "a jitted step traces once". One update is
    enough: tracing is deterministic in the avals, so a state that comes back with its
    own avals does so at every later step. That update is traced inside a `lax.scan`
    body, its state as a `lax.cond` branch. `compiled=True` also runs three real
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
    quantized = _quantized_paths(state, params, state_dtype)
    for path, dt, shape, weak in init_avals[1]:
        assert not weak, f"weakly typed state leaf {path}"
        if path in quantized:
            continue
        if jnp.issubdtype(dt, jnp.integer):
            assert dt == np.dtype(jnp.int32), f"{path} is {dt}, not int32"
        elif jnp.issubdtype(dt, jnp.floating):
            allowed = scalar_ok if shape == () else floats
            assert dt in allowed, f"{path} is {dt}; params are {floats}"

    # One update: identical state avals, updates in the params' dtypes. The update is
    # traced once, as the body of a `lax.scan` whose carry is the state, and its new
    # state is one branch of a `lax.cond` whose other branch is the old state: both
    # need types that match exactly.
    updates, new_state = eqx.filter_eval_shape(
        _scan_of_cond_step, opt, grads, state, params, extra
    )
    assert avals(new_state) == init_avals
    for u, q in zip(jtu.tree_leaves(updates), jtu.tree_leaves(params)):
        assert u.dtype == q.dtype

    if compiled:
        _check_compiled_steps(opt, case, params, grad_dtype, init_avals)


def _check_compiled_steps(opt, case, params, grad_dtype, init_avals):
    """Three real jitted steps, a serialisation round trip of `(opt, state, params)`,
    three more steps from the restored copy and from the original: bit-identical, the
    state's avals unchanged after every step, and one trace in all."""
    traces = 0

    @eqx.filter_jit
    def step(opt, grads, state, params, extra):
        nonlocal traces
        traces += 1
        return opt.step(params, grads, state, **extra)

    def run(opt, state, params, keys):
        for key in keys:
            grads = case_grads(
                case, params, key, None if grad_dtype == "same" else jnp.float32
            )
            params, state = step(opt, grads, state, params, case_extra(case, params))
            assert avals(state) == init_avals
        return params, state

    dtypes = [q.dtype for q in jtu.tree_leaves(params)]
    keys = jr.split(jr.key(1), 6)
    p_mid, s_mid = run(opt, opt.init(params), params, keys[:3])
    assert [q.dtype for q in jtu.tree_leaves(p_mid)] == dtypes, "params changed dtype"
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, (opt, s_mid, p_mid))
    buffer.seek(0)
    skeleton = (opt, opt.init(params), params)
    opt2, s2, p2 = eqx.tree_deserialise_leaves(buffer, skeleton)
    resumed = run(opt2, s2, p2, keys[3:])
    straight = run(opt, s_mid, p_mid, keys[3:])
    assert eqx.tree_equal(resumed, straight, typematch=True), "resumed run differs"
    assert traces == 1


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_compiled_steps_trace_once_and_resume_from_a_checkpoint(case):
    """Optax 0.2.8's failing setting, run for real: bfloat16 params, float32 grads;
    serialised mid-run with `eqx.tree_serialise_leaves` and resumed bit-identically."""
    check_state_properties(case.make(), case, "bfloat16", "float32", compiled=True)


# Checked elsewhere: bfloat16 params with float32 grads (compiled) by the test above,
# float32 params and grads by test_core_protocol.py on an optimizer built inside `jit`.
_ELSEWHERE = {("bfloat16", "float32"), ("float32", "same"), ("float32", "float32")}
DTYPE_PAIRS = [(d, g) for d in DTYPES for g in GRAD_DTYPES if (d, g) not in _ELSEWHERE]


@pytest.mark.parametrize("dtype_name, grad_dtype", DTYPE_PAIRS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_state_is_stable(case, dtype_name, grad_dtype):
    check_state_properties(case.make(), case, dtype_name, grad_dtype)


@pytest.mark.parametrize("dtype_name", ["bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_state_dtype_float32_buffers(case, dtype_name):
    opt = _with_state_dtype(case.make(), jnp.float32)
    if opt is None:
        pytest.skip("no state_dtype option")
    check_state_properties(opt, case, dtype_name, "float32", state_dtype=jnp.float32)


# Inside `MultiSteps`, each entry runs one param dtype, in rotation (so every dtype is
# covered by a quarter of the registry), with grads in that dtype and in float32. The
# inner optimizer sees what it sees unwrapped (the window's mean in the grads' dtype),
# and that is checked above for every dtype pair: what is under test here is the
# wrapper around each entry.
_MULTISTEPS = [
    (case, dtype_name, grad_dtype)
    for i, case in enumerate(c for c in CASES if c.wrappable)
    for dtype_name in [list(DTYPES)[i % len(DTYPES)]]
    for grad_dtype in (["same"] if dtype_name == "float32" else GRAD_DTYPES)
]


@pytest.mark.parametrize(
    "case, dtype_name, grad_dtype",
    _MULTISTEPS,
    ids=[f"{c.id}-{d}-{g}" for c, d, g in _MULTISTEPS],
)
def test_state_is_stable_under_multisteps(case, dtype_name, grad_dtype):
    """Every registry optimizer inside `MultiSteps(..., every_k=2)` (its `lax.cond`
    traces both the accumulating and the applying call): the same properties."""
    opt = eqxopt.MultiSteps(case.make(), every_k=2)
    check_state_properties(opt, case, dtype_name, grad_dtype)


def _with_empty_leaves(shapes):
    """`shapes` with leaves that have no elements, in the same tree (so masks and
    labels written for it still apply): the first leaf of rank >= 2 loses its columns
    (`(m, 0)`), the first vector its entries and, with three leaves of rank >= 2 or
    more, the last loses its rows (`(0, n)`); each only while another leaf keeps its
    elements."""
    leaves, treedef = jtu.tree_flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
    leaves = list(leaves)
    matrices = [i for i, s in enumerate(leaves) if len(s) >= 2]
    vectors = [i for i, s in enumerate(leaves) if len(s) == 1]
    emptied = []
    if matrices:
        emptied.append((matrices[0], leaves[matrices[0]][:-1] + (0,)))
    if vectors:
        emptied.append((vectors[0], (0,)))
    if len(matrices) >= 3:
        emptied.append((matrices[-1], (0,) + leaves[matrices[-1]][1:]))
    for i, shape in emptied:
        if sum(0 not in s for j, s in enumerate(leaves) if j != i) > 0:
            leaves[i] = shape
    return jtu.tree_unflatten(treedef, leaves)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_empty_leaves_and_zero_grads_leave_no_nan(case):
    """Degenerate inputs that real models produce: leaves with no elements (a
    zero-width layer), and gradients that are exactly zero for the first steps (a
    LoRA factor facing a zero-initialised one, a branch not used yet). Empty leaves
    get empty updates of their shape, and no step leaves a NaN in the updates, the
    state or the params: nothing divides 0 by 0, reduces over an empty axis or fails
    to trace."""
    shapes = _with_empty_leaves(SHAPES if case.shapes is None else case.shapes)
    params = make_params(jnp.float32, shapes)
    assert any(x.size == 0 for x in jtu.tree_leaves(params))
    assert any(x.size > 0 for x in jtu.tree_leaves(params))
    opt = case.make()
    state = opt.init(params)
    step = eqx.filter_jit(lambda o, g, s, p, e: o.update(g, s, p, **e))
    for i, key in enumerate(jr.split(jr.key(2), 3)):
        grads = case_grads(case, params, key)
        if i < 2:
            grads = jtu.tree_map(jnp.zeros_like, grads)
        extra = case_extra(case, params)
        if "grad" in extra:  # L-BFGS's `grad=` is the same gradient
            extra["grad"] = grads
        updates, state = step(opt, grads, state, params, extra)
        assert [u.shape for u in jtu.tree_leaves(updates)] == [
            p.shape for p in jtu.tree_leaves(params)
        ]
        params = eqx.apply_updates(params, updates)
        for path, x in jtu.tree_flatten_with_path((updates, state, params))[0]:
            if eqx.is_inexact_array(x):
                assert not jnp.any(jnp.isnan(x)), f"step {i}: NaN at {jtu.keystr(path)}"


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.extra is None], ids=lambda c: c.id
)
def test_complex_params_are_optimised_or_refused_by_name(case):
    """Complex leaves are optimised (design.md#protocol). Every entry either takes
    complex64 params (updates in complex64, a state that keeps its avals through an
    update traced as a `lax.scan` body and a `lax.cond` branch), or is one of the few
    that take real params only and says so at `init`, naming the leaf: wrapped in
    `SplitRealAndImaginary`, as its error suggests, it then takes them. (Traced
    abstractly, under JAX's default dtype promotion: complex arithmetic mixes complex
    and real arrays. Entries whose `update` needs the loss are left out: the registry's
    losses are real functions of real params.)"""
    real = make_params(jnp.float32, case.shapes)
    params = jtu.tree_map(lambda x: lax.complex(x, 0.5 * x), real)
    grads = jtu.tree_map(
        lambda x: lax.complex(x, -x),
        make_params(jnp.float32, case.shapes, jr.key(5)),
    )
    opt = case.make()
    with jax.numpy_dtype_promotion("standard"):
        _check_complex(opt, params, grads)


def _check_complex(opt, params, grads):
    try:
        state = eqx.filter_eval_shape(opt.init, params)
    except ValueError as e:
        leaf = jtu.keystr(jtu.tree_flatten_with_path(params)[0][0][0])
        assert "takes real params only" in str(e) and f"`{leaf}`" in str(e)
        opt = eqxopt.SplitRealAndImaginary(opt)
        state = eqx.filter_eval_shape(opt.init, params)
    updates, new_state = eqx.filter_eval_shape(
        _scan_of_cond_step, opt, grads, state, params, {}
    )
    assert avals(new_state) == avals(state)
    assert {u.dtype for u in jtu.tree_leaves(updates)} == {np.dtype(jnp.complex64)}


# Quantized state (docs/memory_precision.md): every entry whose optimizer takes an
# `eqxopt.Quantized` `state_dtype` (its param-mirroring buffers quantized) in each
# format, with blocks of 4 so the registry's small leaves are quantized too (several
# blocks, a zero-padded last one). The properties above are checked abstractly in
# every format: state types, a `lax.scan` carry and `lax.cond` branch, inside
# `MultiSteps` (its accumulator quantized too) and `eqxopt.verify`'s report. The
# compiled checks (three real steps, one trace, a serialisation round trip resumed
# bit-identically) and the placement on a mesh (an eager `init`, as `state_shardings`
# predicts) run in one format per entry, in rotation: one compile per entry.
FORMATS = ("int8", "int4", "fp8")


def _quantized(case, fmt):
    """`case`'s optimizer with `state_dtype=Quantized(fmt)`, or `None` if it refuses."""
    spec = eqxopt.Quantized(fmt, block_size=4, min_size=1)
    try:
        return _with_state_dtype(case.make(), spec), spec
    except ValueError:  # no buffer that mirrors a param, or no quantized storage yet
        return None, spec


_QUANTIZABLE = [c for c in CASES if _quantized(c, "int8")[0] is not None]
_QUANTIZED = [
    (case, fmt, fmt == FORMATS[i % len(FORMATS)])
    for i, case in enumerate(_QUANTIZABLE)
    for fmt in FORMATS
]


@pytest.mark.parametrize(
    "case, fmt, compiled",
    _QUANTIZED,
    ids=[f"{c.id}-{f}" + ("-compiled" if k else "") for c, f, k in _QUANTIZED],
)
def test_quantized_state(case, fmt, compiled):
    from .test_sharding import _mesh, _shard, _shardable

    opt, spec = _quantized(case, fmt)
    assert opt is not None
    check_state_properties(opt, case, "bfloat16", "float32", spec, compiled)
    if case.wrappable:
        wrapped = eqxopt.MultiSteps(opt, every_k=2, accumulator_dtype=spec)
        check_state_properties(wrapped, case, "float32", "same", spec)

    # `verify` traces it and reports the codes and scales, byte for byte.
    params = make_params(jnp.float32, case.shapes)
    report = eqxopt.verify(opt, params, **case_extra(case, params))
    state = eqx.filter_eval_shape(opt.init, params)
    assert [(r.path, r.dtype, r.shape) for r in report.leaves] == [
        (path, dt.name, shape) for path, dt, shape, _ in avals(state)[1]
    ]
    assert report.nbytes == sum(
        x.size * np.dtype(x.dtype).itemsize for x in jtu.tree_leaves(state)
    )

    if not compiled:
        return
    # On a mesh: an eager `init` places the codes and scales as `state_shardings`
    # predicts.
    sharded = _shard(
        make_params(jnp.float32, _shardable(case.shapes or SHAPES)), _mesh()
    )
    predicted = eqxopt.state_shardings(opt, sharded)
    state = opt.init(sharded)
    assert jtu.tree_structure(predicted) == jtu.tree_structure(state)
    for (path, leaf), want in zip(
        jtu.tree_leaves_with_path(state), jtu.tree_leaves(predicted)
    ):
        if not jtu.keystr(path).endswith((".codes", ".scales")):
            continue  # (tests/test_sharding.py: the other leaves, under `jit`)
        assert leaf.sharding.is_equivalent_to(want, leaf.ndim), (
            f"state{jtu.keystr(path)} is {leaf.sharding}, predicted {want}"
        )
