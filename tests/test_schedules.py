"""eqxopt.schedules: parity with Optax 0.2.8, the extra schedules, errors, tracing."""

import functools as ft

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqxopt.schedules as S


# 0..N covers every boundary below and the steps beyond the end; then a few large ones.
COUNTS = np.concatenate([np.arange(0, 301), [1_000, 10**6, 2**31 - 1]]).astype(np.int32)
EAGER_COUNTS = [0, 1, 10, 11, 30, 49, 50, 51, 100, 101, 250, 10**6]


def _case(cls, optax_fn, *args, **kwargs):
    """Ours and Optax's, built from the same arguments (the signatures are the same).

    The third value says whether Optax's reference may be evaluated under `jit`.
    """
    ours = ft.partial(cls, *args, **kwargs)
    return pytest.param(ours, optax_fn(*args, **kwargs), True, id=cls.__name__)


def _eager_reference(param):
    # Under `jit`, XLA fuses Optax's `1 - t / T` into `1 - t * (1/T)`, which is -2e-17
    # at t = T; a power of 0.5 then gives NaN (Optax bug, x64: `jax.jit(optax.
    # polynomial_schedule(1.0, 0.5, 0.5, 50))(50)` is NaN). Ours computes `(T - t) / T`,
    # exactly 0 there, so this reference is evaluated eagerly.
    return pytest.param(*param.values[:2], False, id=param.id)


_cycle = dict(init_value=0.1, peak_value=1.0, warmup_steps=10, decay_steps=50)
CASES = [
    _case(S.Constant, optax.constant_schedule, 0.3),
    _case(S.Constant, optax.constant_schedule, 5),  # an int value: we return a float
    _case(S.Polynomial, optax.polynomial_schedule, 1.0, 0.01, 2, 100),
    _eager_reference(
        _case(S.Polynomial, optax.polynomial_schedule, 1.0, 0.5, 0.5, 50, 20)
    ),
    _case(S.Polynomial, optax.polynomial_schedule, 1.0, 0.5, 3, 0),  # -> constant
    _case(S.Polynomial, optax.polynomial_schedule, 1.0, 0.5, 1, 30, -5),  # begin -> 0
    _case(S.Linear, optax.linear_schedule, 1.0, 0.1, 100, 50),
    _case(S.Linear, optax.linear_schedule, 0, 1, 100),  # Python ints
    _case(S.Linear, optax.linear_schedule, 1.0, 0.0, -1),  # -> constant
    _case(S.ExponentialDecay, optax.exponential_decay, 1.0, 50, 0.5),
    _case(S.ExponentialDecay, optax.exponential_decay, 1.0, 20, 0.5, 10, True),
    _case(S.ExponentialDecay, optax.exponential_decay, 1.0, 20, 0.5, end_value=0.2),
    _case(S.ExponentialDecay, optax.exponential_decay, 1.0, 20, 2.0, end_value=5.0),
    _case(S.ExponentialDecay, optax.exponential_decay, 1.0, 20, 0.0),  # -> constant
    _case(S.ExponentialDecay, optax.exponential_decay, 1.0, 0, 0.5),  # -> constant
    _case(S.ExponentialDecay, optax.exponential_decay, 1.0, 10, 0.9, -3),
    _case(S.CosineDecay, optax.cosine_decay_schedule, 1.0, 100),
    _case(S.CosineDecay, optax.cosine_decay_schedule, 2.0, 50, 0.1, 2.0),
    _case(S.CosineDecay, optax.cosine_decay_schedule, 1.0, 1),
    _case(S.WarmupCosineDecay, optax.warmup_cosine_decay_schedule, 0.0, 1.0, 10, 100),
    _case(
        S.WarmupCosineDecay,
        optax.warmup_cosine_decay_schedule,
        *(0.1, 2.0, 30, 250, 0.1, 2.0),
    ),
    _case(S.WarmupCosineDecay, optax.warmup_cosine_decay_schedule, 0.5, 1.0, 0, 100),
    _case(S.WarmupCosineDecay, optax.warmup_cosine_decay_schedule, 0.5, 0.0, 10, 50),
    _case(S.WarmupConstant, optax.warmup_constant_schedule, 0.1, 1.0, 50),
    _case(S.WarmupConstant, optax.warmup_constant_schedule, 0.1, 1.0, 0),  # -> init
    _case(
        S.WarmupExponentialDecay,
        optax.warmup_exponential_decay_schedule,
        *(0.0, 1.0, 10, 20, 0.5),
    ),
    _case(
        S.WarmupExponentialDecay,
        optax.warmup_exponential_decay_schedule,
        *(0.0, 1.0, 10, 20, 0.5, 5, True, 0.1),
    ),
    _case(
        S.PiecewiseConstant,
        optax.piecewise_constant_schedule,
        *(1.0, {50: 0.5, 100: 0.1, 20: 2.0}),
    ),
    _case(S.PiecewiseConstant, optax.piecewise_constant_schedule, 1.0),
    _case(S.PiecewiseConstant, optax.piecewise_constant_schedule, 1.0, {0: 0.5}),
    _case(
        S.PiecewiseInterpolate,
        optax.piecewise_interpolate_schedule,
        *("linear", 1.0, {4: 0.1, 8: 0.01, 100: 3.0}),
    ),
    _case(
        S.PiecewiseInterpolate,
        optax.piecewise_interpolate_schedule,
        *("cosine", 1.0, {50: 0.1, 30: 2.0, 0: 0.5}),
    ),
    _case(S.PiecewiseInterpolate, optax.piecewise_interpolate_schedule, "linear", 2.0),
    _case(S.SGDR, optax.sgdr_schedule, [_cycle, dict(_cycle, decay_steps=80)]),
    _case(
        S.SGDR,
        optax.sgdr_schedule,
        [dict(_cycle, warmup_steps=0, end_value=0.1, exponent=2.0)] * 3,
    ),
    _case(S.CosineOneCycle, optax.cosine_onecycle_schedule, 100, 1.0),
    _case(S.CosineOneCycle, optax.cosine_onecycle_schedule, 200, 2.0, 0.5, 10, 100),
    _case(S.CosineOneCycle, optax.cosine_onecycle_schedule, 1, 1.0),  # keys collide
    _case(S.LinearOneCycle, optax.linear_onecycle_schedule, 100, 1.0),
    _case(
        S.LinearOneCycle,
        optax.linear_onecycle_schedule,
        *(10, 2.0, 0.2, 0.9, 5.0, 100.0),
    ),
    _case(S.LinearOneCycle, optax.linear_onecycle_schedule, 1, 1.0),  # keys collide
    pytest.param(
        lambda: S.Join([S.Linear(0.0, 1.0, 10), S.CosineDecay(1.0, 50)], [10]),
        optax.join_schedules(
            [optax.linear_schedule(0.0, 1.0, 10), optax.cosine_decay_schedule(1.0, 50)],
            [10],
        ),
        True,
        id="Join",
    ),
    pytest.param(  # an Optax schedule inside ours, and three pieces
        lambda: S.join_schedules(
            [
                S.Constant(0.1),
                optax.constant_schedule(0.5),
                S.ExponentialDecay(1, 5, 0.5),
            ],
            [20, 40],
        ),
        optax.join_schedules(
            [
                optax.constant_schedule(0.1),
                optax.constant_schedule(0.5),
                optax.exponential_decay(1, 5, 0.5),
            ],
            [20, 40],
        ),
        True,
        id="Join",
    ),
]


def _reference(reference, counts):
    # int64 counts: Optax computes `int32 / int` in float32, even under x64.
    with jax.numpy_dtype_promotion("standard"):  # Optax is not strict-clean
        values = jax.vmap(reference)(jnp.asarray(counts, jnp.int64))
    return jnp.broadcast_to(jnp.asarray(values, jnp.float64), jnp.shape(counts))


def _check(values, expected):
    # atol: where a schedule reaches 0 (e.g. cos(pi)), values differ by float64 noise.
    np.testing.assert_allclose(values, expected, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("make, reference, jit_reference", CASES)
def test_matches_optax(make, reference, jit_reference):
    schedule = make()
    counts = jnp.asarray(COUNTS)

    @jax.jit  # one compilation for both (compiling dominates the run time)
    def evaluate(counts):
        ours = jax.vmap(schedule)(counts)
        return ours, _reference(reference, counts) if jit_reference else None

    values, expected = evaluate(counts)
    if not jit_reference:
        expected = _reference(reference, counts)
    expected = np.asarray(expected)
    # jitted, over every count
    assert values.shape == COUNTS.shape
    assert jnp.issubdtype(values.dtype, jnp.floating)
    _check(values, expected)
    # not jitted, one scalar count at a time: int32 arrays and Python ints
    for count in EAGER_COUNTS:
        (index,) = np.flatnonzero(COUNTS == count)
        for c in (jnp.int32(count), count) if count % 2 else (jnp.int32(count),):
            out = schedule(c)
            assert out.shape == () and jnp.issubdtype(out.dtype, jnp.floating)
            _check(out, expected[index])


# The values a schedule is defined to take (its start, the end of a warmup, the end of a
# decay), as counts -> values. Under `jit` XLA folds the constants of the formulas, so
# these must be selected, not computed: a warmup from 0 took -5.6e-17 (a negative
# learning rate) at its first step, 0.1 came out as 0.0999999999999999.
EXACT = [
    (lambda: S.Linear(0.0, 1.0, 100), {0: 0.0, 100: 1.0, 500: 1.0}),
    (lambda: S.Linear(1.0, 0.1, 100, 50), {0: 1.0, 50: 1.0, 150: 0.1}),
    (lambda: S.Polynomial(1.0, 0.5, 0.5, 50, 20), {20: 1.0, 70: 0.5}),
    (lambda: S.WarmupCosineDecay(0.0, 1.0, 10, 100), {0: 0.0, 10: 1.0, 100: 0.0}),
    (
        lambda: S.WarmupCosineDecay(0.1, 2.0, 30, 250, 0.1),
        {0: 0.1, 30: 2.0, 250: 0.1},
    ),
    (lambda: S.WarmupConstant(0.1, 1.0, 50), {0: 0.1, 50: 1.0}),
    (lambda: S.WarmupExponentialDecay(0.0, 1.0, 10, 20, 0.5), {0: 0.0, 10: 1.0}),
    (lambda: S.CosineDecay(2.0, 50, 0.1), {0: 2.0, 50: 0.2}),
    (lambda: S.SGDR([_cycle, _cycle]), {0: 0.1, 10: 1.0, 50: 0.1, 60: 1.0}),
    (lambda: S.LinearOneCycle(100, 1.0), {0: 0.04, 30: 1.0}),
    (lambda: S.CosineOneCycle(100, 1.0), {0: 0.04, 30: 1.0}),
    (
        lambda: S.PiecewiseInterpolate("cosine", 1.0, {50: 0.1, 30: 2.0}),
        {0: 1.0, 30: 2.0, 50: 0.2},
    ),
]


@pytest.mark.parametrize("make, values", EXACT)
def test_defined_values_are_exact_under_jit_and_eagerly(make, values):
    schedule = make()
    counts = list(values)
    want = np.asarray(list(values.values()))
    jitted = np.asarray(jax.jit(jax.vmap(schedule))(jnp.asarray(counts, jnp.int32)))
    eager = np.asarray([schedule(jnp.int32(c)) for c in counts])
    np.testing.assert_array_equal(jitted, want, strict=True)
    np.testing.assert_array_equal(eager, want, strict=True)


@pytest.mark.parametrize("make, reference, jit_reference", CASES)
def test_no_arrays_at_construction(make, reference, jit_reference):
    del reference, jit_reference
    built = []
    jax.make_jaxpr(lambda: built.append(make()))()  # built inside a trace
    assert not any(eqx.is_array(x) for x in jax.tree.leaves(built))


@pytest.mark.parametrize(
    "make",
    [
        lambda: S.SGDR([_cycle, dict(_cycle, decay_steps=80)]),
        lambda: S.Join([S.Linear(0.0, 1.0, 10), S.CosineDecay(1.0, 50)], [10]),
        lambda: S.LinearOneCycle(100, 1.0),
        lambda: S.PiecewiseConstant(1.0, {10: 0.5}),
        lambda: S.WarmupStableDecay(0.0, 1.0, 10, 10, 10, decay_type="cosine"),
        lambda: S.InverseSqrt(1.0, 10),
    ],
)
def test_built_in_one_jit_used_in_another(make):
    built = []

    @jax.jit
    def build_and_call(count):
        built.append(make())
        return built[-1](count)

    first = build_and_call(jnp.int32(25))
    (schedule,) = built
    second = jax.jit(lambda count: schedule(count))(jnp.int32(25))
    np.testing.assert_array_equal(first, second)
    _check(schedule(25), first)  # eager: may differ in the last bit


def test_optax_names():
    for name in (
        "constant_schedule polynomial_schedule linear_schedule exponential_decay "
        "cosine_decay_schedule warmup_cosine_decay_schedule warmup_constant_schedule "
        "warmup_exponential_decay_schedule piecewise_constant_schedule "
        "piecewise_interpolate_schedule join_schedules sgdr_schedule "
        "cosine_onecycle_schedule linear_onecycle_schedule"
    ).split():
        assert hasattr(optax.schedules, name)
        cls = getattr(S, name)
        assert isinstance(cls, type) and issubclass(cls, S.AbstractSchedule)
        assert cls.__name__.lower().replace("_", "") in name.replace("_", "")
    assert S.exponential_decay(1.0, 10, 0.5) == S.ExponentialDecay(1.0, 10, 0.5)


def test_dtypes():
    def dtype(schedule):
        return jax.eval_shape(schedule, jnp.int32(7)).dtype

    f32 = jnp.asarray(1.0, jnp.float32)
    assert dtype(S.CosineDecay(1.0, 10)) == jnp.float64  # x64: the default float
    assert dtype(S.CosineDecay(f32, 10)) == jnp.float32  # an array's dtype wins
    assert dtype(S.Linear(jnp.bfloat16(1), 0.0, 10)) == jnp.float32  # >= float32
    assert dtype(S.Constant(jnp.int32(5))) == jnp.float64  # never an int
    assert S.Constant(5)(0).dtype == jnp.float64
    with jax.enable_x64(False):
        for make, _, _ in (p.values for p in CASES):
            assert callable(make)
            assert dtype(make()) == jnp.float32
        schedule = S.WarmupCosineDecay(0.0, 1.0, 10, 100)
        reference = optax.warmup_cosine_decay_schedule(0.0, 1.0, 10, 100)
        with jax.numpy_dtype_promotion("standard"):
            expected = reference(jnp.int32(40))
        # float32: 1e-5, not 1e-6 (Optax and ours round differently)
        np.testing.assert_allclose(schedule(jnp.int32(40)), expected, rtol=1e-5)


def _wsd(t, init, peak, warmup, stable, decay, end, decay_type):
    if t < warmup:
        return init + (peak - init) * t / warmup
    if t < warmup + stable:
        return peak
    if t < warmup + stable + decay:
        x = (t - warmup - stable) / decay
        f = {
            "linear": 1 - x,
            "cosine": 0.5 * (1 + np.cos(np.pi * x)),
            "sqrt": 1 - np.sqrt(x),
        }[decay_type]
        return end + (peak - end) * f
    return end


@pytest.mark.parametrize("decay_type", ["linear", "cosine", "sqrt"])
@pytest.mark.parametrize(
    "args",
    [(0.0, 1.0, 10, 50, 40, 0.0), (0.1, 2.0, 0, 30, 7, 0.5), (0.5, 1.0, 5, 0, 0, 0.2)],
)
def test_warmup_stable_decay(args, decay_type):
    schedule = S.WarmupStableDecay(*args, decay_type=decay_type)
    counts = np.arange(0, 120)
    expected = [_wsd(t, *args, decay_type=decay_type) for t in counts]
    _check(jax.jit(jax.vmap(schedule))(jnp.asarray(counts, jnp.int32)), expected)
    if args[4] > 0:  # peak at the start of the decay
        _check(schedule(jnp.int32(args[2] + args[3])), args[1])


def _rsqrt(t, init, warmup, timescale):
    tau = max(warmup, 1) if timescale is None else timescale
    ramp = min(t / warmup, 1.0) if warmup > 0 else 1.0
    return init * ramp * np.sqrt(tau / max(t, tau))


@pytest.mark.parametrize(
    "args", [(1.0, 0, None), (1e-3, 100, None), (0.01, 0, 10_000), (2.0, 20, 50)]
)
def test_inverse_sqrt(args):
    schedule = S.InverseSqrt(*args)
    counts = np.array([0, 1, 10, 19, 20, 21, 50, 99, 100, 400, 10_000, 40_000])
    expected = [_rsqrt(t, *args) for t in counts]
    _check(jax.jit(jax.vmap(schedule))(jnp.asarray(counts, jnp.int32)), expected)
    _check([schedule(int(c)) for c in counts], expected)


def test_inverse_sqrt_values():
    _check(S.InverseSqrt(1e-3, warmup_steps=100)(50), 5e-4)
    _check(S.InverseSqrt(1e-3, warmup_steps=100)(400), 5e-4)
    _check(S.InverseSqrt(0.01, timescale=10_000)(40_000), 0.005)  # T5: 1/sqrt(t)


_w = dict(init_value=0.0, peak_value=1.0)
# Wrong values, some of them of a wrong type on purpose (those lines tell pyright).
BAD = [
    (lambda: S.CosineDecay(1.0, 0), "decay_steps"),
    (lambda: S.CosineDecay(1.0, -3), "decay_steps"),
    (lambda: S.Polynomial(1.0, 0.0, 1, 10.5), "transition_steps"),
    (lambda: S.Linear(1.0, 0.0, "10"), "transition_steps"),  # pyright: ignore[reportArgumentType]
    (lambda: S.Linear(1.0, 0.0, 10, 2.5), "transition_begin"),
    (lambda: S.ExponentialDecay(1.0, 10, -0.5), "decay_rate"),
    (lambda: S.WarmupCosineDecay(0.0, 1.0, 10, 10), "decay_steps"),
    (lambda: S.WarmupCosineDecay(0.0, 1.0, -1, 10), "warmup_steps"),
    (lambda: S.WarmupConstant(0.0, 1.0, -1), "warmup_steps"),
    (lambda: S.WarmupExponentialDecay(0.0, 1.0, -2, 10, 0.5), "warmup_steps"),
    (lambda: S.WarmupExponentialDecay(0.0, 1.0, 2, 10, -0.5), "decay_rate"),
    (lambda: S.PiecewiseConstant(1.0, {10: -0.1}), "boundaries_and_scales"),
    (lambda: S.PiecewiseConstant(1.0, {10.5: 0.1}), "boundaries_and_scales"),
    (lambda: S.PiecewiseInterpolate("quadratic", 1.0), "interpolate_type"),  # pyright: ignore[reportArgumentType]
    (lambda: S.PiecewiseInterpolate("linear", 1.0, {5: -1.0}), "boundaries_and_scales"),
    (lambda: S.Join([], []), "schedules"),
    (lambda: S.Join([S.Constant(1.0), S.Constant(2.0)], []), "boundaries"),
    (lambda: S.Join([S.Constant(1.0), S.Constant(2.0)], [1.5]), "boundaries"),
    (lambda: S.SGDR([]), "cosine_kwargs"),
    (lambda: S.SGDR([dict(_w, warmup_steps=5, decay_steps=5)]), "decay_steps"),
    (lambda: S.CosineOneCycle(0, 1.0), "transition_steps"),
    (lambda: S.CosineOneCycle(100, 1.0, pct_start=1.5), "pct_start"),
    (lambda: S.CosineOneCycle(100, 1.0, div_factor=0.0), "div_factor"),
    (lambda: S.CosineOneCycle(100, 1.0, final_div_factor=-1.0), "final_div_factor"),
    (lambda: S.LinearOneCycle(-5, 1.0), "transition_steps"),
    (lambda: S.LinearOneCycle(100, 1.0, pct_start=0.9, pct_final=0.5), "pct_final"),
    (lambda: S.LinearOneCycle(100, 1.0, div_factor=-25.0), "div_factor"),
    (lambda: S.WarmupStableDecay(0.0, 1.0, -1, 10, 10), "warmup_steps"),
    (lambda: S.WarmupStableDecay(0.0, 1.0, 10, -1, 10), "stable_steps"),
    (lambda: S.WarmupStableDecay(0.0, 1.0, 10, 10, -1), "decay_steps"),
    (lambda: S.WarmupStableDecay(0.0, 1.0, 1, 1, 1, decay_type="exp"), "decay_type"),  # pyright: ignore[reportArgumentType]
    (lambda: S.InverseSqrt(1.0, -1), "warmup_steps"),
    (lambda: S.InverseSqrt(1.0, 10, timescale=0), "timescale"),
]


@pytest.mark.parametrize("make, field", BAD)
def test_bad_values_raise(make, field):
    with pytest.raises(ValueError, match=rf"\({field}=\.\.\.\)` must be"):
        make()


def test_error_message():
    with pytest.raises(ValueError) as info:
        S.CosineDecay(1.0, decay_steps=0)
    assert str(info.value) == "`CosineDecay(decay_steps=...)` must be > 0, got 0."


def test_traced_values_are_not_checked():
    # A traced `decay_rate` cannot be checked at construction, so it passes through.
    fn = jax.jit(lambda r, c: S.ExponentialDecay(1.0, 10, r)(c))
    _check(fn(jnp.asarray(0.5), jnp.int32(20)), 0.25)


@pytest.mark.parametrize(
    "schedule",
    [  # init_value = end_value = 0, so each is linear in `peak_value`
        S.WarmupCosineDecay(0.0, jnp.asarray(1.0), 10, 100),
        S.WarmupConstant(0.0, jnp.asarray(1.0), 10),
        S.WarmupExponentialDecay(0.0, jnp.asarray(1.0), 10, 20, 0.5),
        S.WarmupStableDecay(0.0, jnp.asarray(1.0), 10, 10, 10),
        S.CosineOneCycle(100, jnp.asarray(1.0)),
        S.LinearOneCycle(100, jnp.asarray(1.0)),
    ],
    ids=lambda s: type(s).__name__,
)
def test_tree_at_peak_value_does_not_retrace(schedule):
    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def evaluate(schedule, counts):
        return jax.vmap(schedule)(counts)

    counts = jnp.arange(0, 120, dtype=jnp.int32)
    base = np.asarray(evaluate(schedule, counts))
    assert base.max() == 1.0
    for peak in (2.0, 0.5, 0.0):
        changed = eqx.tree_at(lambda s: s.peak_value, schedule, jnp.asarray(peak))
        _check(evaluate(changed, counts), peak * base)


def test_warmup_cosine_traced_peak_value():
    # `end_value / peak_value` (Optax's alpha) is computed from a traced peak here.
    @jax.jit
    def evaluate(peak, counts):
        return jax.vmap(S.WarmupCosineDecay(0.1, peak, 10, 100, end_value=0.2))(counts)

    for peak in (2.0, 0.0):
        reference = optax.warmup_cosine_decay_schedule(0.1, peak, 10, 100, 0.2)
        values = evaluate(jnp.asarray(peak), jnp.asarray(COUNTS))
        _check(values, _reference(reference, COUNTS))


def test_tree_at_scale_does_not_retrace():
    schedule = S.PiecewiseConstant(1.0, {10: jnp.asarray(0.5)})

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def evaluate(schedule, count):
        return schedule(count)

    for scale in (0.5, 0.1, 2.0):
        changed = eqx.tree_at(
            lambda s: s.boundaries_and_scales[10], schedule, jnp.asarray(scale)
        )
        _check(evaluate(changed, jnp.int32(10)), scale)
        _check(evaluate(changed, jnp.int32(9)), 1.0)
