"""Wrappers (design.md#conventions): `ZeroNans`, `ApplyIfFinite`, `MultiSteps`,
`Masked`, `Partition`, and the Optax failures they rebuild.

- `MultiSteps(Chain(ZeroNans(), Adam))`: failed in Optax < 0.2.0 (the bool NaN flags
  were averaged into numbers and `lax.cond` rejected the branches); Optax 0.2.8 still
  resets its accumulator by multiplying by zero, so one NaN poisons every later window.
- Chained `masked(...)` groups, each with its own schedule: every group must move with
  its own learning rate, and changing an array learning rate must not recompile.
"""

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import optax
import pytest

import eqxopt

from .helpers import (
    avals,
    case_extra,
    case_grads,
    CASES,
    make_params,
    random_like,
    tree_allclose,
)


def _params():
    return {
        "w": jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(4, 3),
        "b": jnp.arange(5, dtype=jnp.float32) / 5,
    }


def _grad_sequence(k: int, windows: int):
    """Random grads for `k * windows` micro-steps with NaNs in some of them: window 0
    has a NaN in `w` (at its first micro-step), window 1 is clean, and window 2 has a
    NaN in `b` (at its last micro-step)."""
    params = _params()
    grads = [random_like(key, params) for key in jr.split(jr.key(7), k * windows)]
    grads[0]["w"] = grads[0]["w"].at[1, 2].set(jnp.nan)
    last = 3 * k - 1
    grads[last]["b"] = grads[last]["b"].at[3].set(jnp.nan)
    return grads


def _window_mean(window):
    """The mean of a window's raw grads, built by hand (NaN anywhere -> NaN there)."""
    mean = lambda *gs: np.mean(np.stack(gs).astype(np.float64), 0).astype(np.float32)
    return jtu.tree_map(mean, *window)


def _optax_on_window_means(grads, k):
    """Optax `chain(zero_nans(), adam())` applied once per window to its mean."""
    ref = optax.chain(optax.zero_nans(), optax.adam(0.1, b1=0.8, b2=0.95))
    params = _params()
    state = ref.init(params)
    out = []
    with jax.numpy_dtype_promotion("standard"):  # Optax is not strict-clean
        for w in range(len(grads) // k):
            mean = jtu.tree_map(jnp.asarray, _window_mean(grads[w * k : (w + 1) * k]))
            updates, state = ref.update(mean, state, params)
            params = optax.apply_updates(params, updates)
            out.append(updates)
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_multisteps_zero_nans_adam_scenario(k):
    opt = eqxopt.MultiSteps(
        eqxopt.Chain(eqxopt.ZeroNans(), eqxopt.Adam(0.1, b1=0.8, b2=0.95)), every_k=k
    )
    windows = 4
    grads = _grad_sequence(k, windows)
    expected = _optax_on_window_means(grads, k)
    params = _params()
    state = opt.init(params)
    init_avals = avals(state)

    # Under filter_jit, step by step.
    step = eqx.filter_jit(opt.step)
    history = []
    for i, g in enumerate(grads):
        new_params, state = step(params, g, state)
        updates = jtu.tree_map(lambda a, b: a - b, new_params, params)
        params = new_params
        assert avals(state) == init_avals
        boundary = (i + 1) % k == 0
        assert bool(opt.has_updated(state)) == boundary
        # The accumulator holds NaN only inside a window whose raw grads had one so
        # far: a completed window leaves zeros (Optax's `0 * acc` reset keeps NaN).
        window_so_far = grads[i - i % k : i + 1]
        nan_so_far = any(
            bool(jnp.any(jnp.isnan(x))) for x in jtu.tree_leaves(window_so_far)
        )
        acc_nan = any(
            bool(jnp.any(jnp.isnan(a))) for a in jtu.tree_leaves(state.acc_grads)
        )
        assert acc_nan == (nan_so_far and not boundary), i
        if boundary:
            w = i // k
            assert tree_allclose(updates, expected[w], rtol=1e-5, atol=1e-6), (k, w)
            found_nan = state.inner_state[0].found_nan
            assert bool(found_nan["w"]) == (w == 0)  # window 1 must not see window 0
            assert bool(found_nan["b"]) == (w == 2)
        else:
            assert all(jnp.all(u == 0) for u in jtu.tree_leaves(updates))
        history.append(updates)
    # The NaN entry of window 0 is zeroed for that window only: it moves later.
    assert history[2 * k - 1]["w"][1, 2] != 0
    assert int(state.gradient_step) == windows

    # Inside lax.scan: the same numbers, the state a valid carry.
    def body(carry, g):
        p, s = carry
        u, s = opt.update(g, s, p)
        return (eqx.apply_updates(p, u), s), u

    stacked = jtu.tree_map(lambda *gs: jnp.stack(gs), *grads)
    (p_scan, s_scan), u_scan = jax.jit(lambda c, g: lax.scan(body, c, g))(
        (_params(), opt.init(_params())), stacked
    )
    assert avals(s_scan) == init_avals
    for i in range(len(grads)):
        u_i = jtu.tree_map(lambda u: u[i], u_scan)
        if (i + 1) % k == 0:
            assert tree_allclose(u_i, expected[i // k], rtol=1e-5, atol=1e-6)
        else:
            assert all(jnp.all(u == 0) for u in jtu.tree_leaves(u_i))
    assert tree_allclose(p_scan, params, rtol=1e-6, atol=1e-7)


WRAPPABLE = [c for c in CASES if c.wrappable]


def _assert_close(x, y, rtol, atol):
    """`tree_allclose`, with NaN equal to NaN (some registry states hold NaNs)."""
    assert jtu.tree_structure(x) == jtu.tree_structure(y)
    for a, b in zip(jtu.tree_leaves(x), jtu.tree_leaves(y)):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("case", WRAPPABLE, ids=lambda c: c.id)
def test_multisteps_equals_inner_on_mean(case):
    """MultiSteps(opt, 2) == opt applied to the mean of the window's 2 grads, and the
    inner state after the window is the inner optimizer's (so, by induction, every
    later window matches too).

    Both runs are compiled as one program per entry: with the suite's code generation
    (conftest.py) that is cheaper than running them eagerly, op by op.
    """
    params = make_params(jnp.float64, case.shapes)
    inner = case.make()
    opt = eqxopt.MultiSteps(case.make(), every_k=2)
    g1, g2 = (case_grads(case, params, k) for k in jr.split(jr.key(11), 2))
    extra = case_extra(case, params)

    @eqx.filter_jit
    def run(opt, inner, g1, g2, params, extra):
        state = opt.init(params)
        u1, state = opt.update(g1, state, params, **extra)
        u2, state = opt.update(g2, state, params, **extra)
        mean = jtu.tree_map(lambda a, b: a + (b - a) / 2, g1, g2)  # Welford
        u_ref, s_ref = inner.update(mean, inner.init(params), params, **extra)
        return u1, u2, state, u_ref, s_ref

    u1, u2, state, u_ref, s_ref = run(opt, inner, g1, g2, params, extra)
    assert all(jnp.all(u == 0) for u in jtu.tree_leaves(u1))
    _assert_close(u2, u_ref, rtol=1e-9, atol=1e-12)
    _assert_close(state.inner_state, s_ref, rtol=1e-9, atol=1e-12)


def test_multisteps_accumulator_dtype_and_sum():
    params = {"x": jnp.ones((3,), jnp.bfloat16)}
    opt = eqxopt.MultiSteps(
        eqxopt.SGD(1.0), every_k=3, use_mean=False, accumulator_dtype=jnp.float32
    )
    state = opt.init(params)
    assert state.acc_grads["x"].dtype == jnp.float32
    grads = {"x": jnp.full((3,), 0.001, jnp.float32)}
    updates = None
    for _ in range(3):
        updates, state = opt.update(grads, state, params)
    assert updates is not None
    assert updates["x"].dtype == jnp.bfloat16  # updates in the params' dtype
    assert jnp.allclose(updates["x"].astype(jnp.float32), -0.003, rtol=1e-2)
    hp = opt.hyperparams(state)
    assert hp == {"every_k": 3, "optimizer": {"learning_rate": 1.0}}


def test_multisteps_step_is_update_then_apply():
    """`MultiSteps.step` applies the updates inside the boundary branch (so an
    accumulating call leaves the model alone); it equals `update` + `apply_updates`."""
    model = eqx.nn.MLP(3, 2, 4, 1, key=jr.key(0), dtype=jnp.float32)  # has functions
    opt = eqxopt.MultiSteps(eqxopt.AdamW(0.1, weight_decay=0.1), every_k=2)
    grads = [
        random_like(key, eqx.filter(model, eqx.is_array))
        for key in jr.split(jr.key(1), 4)
    ]

    @eqx.filter_jit
    def run(model, grads):
        m1 = m2 = model
        s1 = s2 = opt.init(model)
        out = []
        for g in grads:
            m1, s1 = opt.step(m1, g, s1)
            updates, s2 = opt.update(g, s2, m2)
            m2 = eqx.apply_updates(m2, updates)
            out.append((m1, s1, m2, s2))
        return out

    m1 = model
    for m1, s1, m2, s2 in run(model, grads):
        assert tree_allclose(m1, m2, rtol=1e-6, atol=1e-7)
        assert tree_allclose(s1, s2, rtol=1e-6, atol=1e-7)
    assert not tree_allclose(m1, model)


def test_multisteps_drift_inside_is_reported_with_full_path():
    class Drifting(eqxopt.AbstractOptimizer):  # a user's transform that drifts
        def init(self, params):
            return {"flag": jnp.zeros((), jnp.bool_)}

        def update(self, grads, state, params=None, **extra):
            return grads, {"flag": state["flag"].astype(jnp.float32)}

    params = _params()
    opt = eqxopt.MultiSteps(eqxopt.Chain(eqxopt.ZeroNans(), Drifting()), every_k=2)
    with pytest.raises(eqxopt.StateDriftError) as info:
        jax.jit(lambda s: opt.update(params, s, params))(opt.init(params))
    assert info.value.path == ".inner_state[1]['flag']"


def test_bad_every_k():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=r"MultiSteps\(every_k=\.\.\.\)"):
            eqxopt.MultiSteps(eqxopt.SGD(0.1), every_k=bad)
    with pytest.raises(ValueError, match=r"MultiSteps\(optimizer=\.\.\.\)"):
        eqxopt.MultiSteps(optax.sgd(0.1), every_k=2)  # pyright: ignore


# --- parameter groups ----------------------------------------------------------------


def _group_params():
    return {
        "a": jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(4, 3),
        "b": jnp.linspace(0.5, 1.5, 5, dtype=jnp.float32),
        "c": jnp.linspace(-2.0, 2.0, 4, dtype=jnp.float32).reshape(2, 2),
    }


def _harmonic_lr(count):
    return 0.05 / (1.0 + count.astype(jnp.float32))


def _group_optimizers(lr_b):
    return {
        "a": eqxopt.Adam(eqxopt.schedules.ExponentialDecay(0.1, 2, 0.5)),
        "b": eqxopt.Adam(lr_b),
        "c": eqxopt.Adam(_harmonic_lr),
    }


def _as_partition(lr_b):
    return eqxopt.Partition(_group_optimizers(lr_b), {"a": "a", "b": "b", "c": "c"})


def _as_masked_chain(lr_b):
    opts = _group_optimizers(lr_b)
    return eqxopt.Chain(
        *(
            eqxopt.Masked(opts[name], {n: n == name for n in ("a", "b", "c")})
            for name in ("a", "b", "c")
        )
    )


def _set_lr_b(opt, value):
    if isinstance(opt, eqxopt.Partition):
        return eqx.tree_at(lambda o: o.optimizers["b"].learning_rate, opt, value)
    return eqx.tree_at(lambda o: o.optimizers[1].optimizer.learning_rate, opt, value)


@pytest.mark.parametrize("build", [_as_partition, _as_masked_chain])
def test_three_groups_each_with_its_own_schedule(build):
    params = _group_params()
    grads = [random_like(k, params) for k in jr.split(jr.key(3), 4)]
    traces = 0

    @eqx.filter_jit
    def step(opt, params, grads, state):
        nonlocal traces
        traces += 1
        return opt.step(params, grads, state)

    def run(opt, lr_b):
        p, s = params, opt.init(params)
        for g in grads:
            p, s = step(opt, p, g, s)
        # Adam alone on each group, with that group's schedule.
        for name, alone in _group_optimizers(lr_b).items():
            q, t = params[name], alone.init(params[name])
            for g in grads:
                q, t = alone.step(q, g[name], t)
            assert not jnp.allclose(p[name], params[name]), name  # every group moves
            assert tree_allclose(p[name], q, rtol=1e-6, atol=1e-7), name
        return s

    lr_b = jnp.asarray(0.03, jnp.float32)
    opt = build(lr_b)
    state = run(opt, lr_b)
    hp = opt.hyperparams(state)  # Partition: by label; Chain of Masked: by index
    if isinstance(opt, eqxopt.Chain):
        hp = {name: hp[i]["optimizer"] for i, name in enumerate("abc")}
    assert jnp.allclose(hp["a"]["learning_rate"], 0.1 * 0.5**2)  # after 4 updates
    assert jnp.allclose(hp["b"]["learning_rate"], 0.03)
    assert jnp.allclose(hp["c"]["learning_rate"], 0.05 / 5)

    # A new array learning rate for group b: the same compiled step, new numbers.
    new_lr = jnp.asarray(0.001, jnp.float32)
    run(_set_lr_b(opt, new_lr), new_lr)
    assert traces == 1


# --- masks -------------------------------------------------------------------------


def _mlp():
    return eqx.nn.MLP(3, 2, 4, 1, key=jr.key(0), dtype=jnp.float32)


def _mlp_grads(model):
    x = jr.normal(jr.key(1), (8, 3), jnp.float32)
    loss = lambda m: jnp.mean(jax.vmap(m)(x) ** 2)
    return eqx.filter_grad(loss)(model)


def test_module_mask_is_a_tree_never_called():
    model = _mlp()
    # A model-shaped eqx.Module of bools (an MLP is callable: it must not be called).
    mask = jtu.tree_map(lambda x: eqx.is_inexact_array(x) and x.ndim == 2, model)
    assert isinstance(mask, eqx.nn.MLP)
    opt = eqxopt.Masked(eqxopt.SGD(0.1), mask)
    state = opt.init(model)
    grads = _mlp_grads(model)
    updates, state = eqx.filter_jit(opt.update)(grads, state, model)
    for layer, g_layer, u_layer in zip(model.layers, grads.layers, updates.layers):
        assert jnp.allclose(u_layer.weight, -0.1 * g_layer.weight)  # masked in
        assert jnp.array_equal(u_layer.bias, g_layer.bias)  # passed through
    # Module labels work for Partition too (optax.partition calls them and crashes).
    labels = jtu.tree_map(
        lambda x: "w" if x.ndim == 2 else "b", eqx.filter(model, eqx.is_array)
    )
    part = eqxopt.Partition({"w": eqxopt.SGD(0.1), "b": eqxopt.SGD(0.2)}, labels)
    updates, _ = part.update(grads, part.init(model), model)
    assert jnp.allclose(updates.layers[0].bias, -0.2 * grads.layers[0].bias)


def test_per_leaf_callables_see_only_arrays():
    model = _mlp()  # has non-array leaves (the activation functions)
    grads = _mlp_grads(model)
    mask = jtu.tree_map(lambda _: None, model)  # a prefix: one callable per layer
    mask = eqx.tree_at(
        lambda m: m.layers,
        mask,
        (lambda p: p.ndim == 2, True),
        is_leaf=lambda x: x is None,
    )
    opt = eqxopt.Masked(eqxopt.SGD(0.5), mask)
    state = opt.init(model)
    assert state.inner_state.count.dtype == jnp.int32
    updates, _ = opt.update(grads, state, model)
    assert jnp.allclose(updates.layers[0].weight, -0.5 * grads.layers[0].weight)
    assert jnp.array_equal(updates.layers[0].bias, grads.layers[0].bias)
    assert jnp.allclose(updates.layers[1].bias, -0.5 * grads.layers[1].bias)
    # A bare callable is a per-leaf predicate.
    opt = eqxopt.Masked(eqxopt.Adam(0.1), eqx.is_inexact_array)
    assert opt.update(grads, opt.init(model), model)[0].layers[1].weight.shape == (
        2,
        4,
    )


def test_mask_errors():
    params = make_params()
    grads = random_like(jr.key(0), params)
    bad_structure = eqxopt.Masked(eqxopt.Adam(0.1), {"linear": True, "other": False})
    with pytest.raises(ValueError, match="`Masked` mask must be a PyTree prefix"):
        bad_structure.init(params)
    not_bool = eqxopt.Masked(eqxopt.Adam(0.1), lambda p: "yes")
    with pytest.raises(ValueError, match=r"one bool per param leaf.*\['conv'\]"):
        not_bool.init(params)
    traced = eqxopt.Masked(eqxopt.Adam(0.1), lambda p: jnp.all(p > 0))
    with pytest.raises(ValueError, match="traced array"):
        jax.jit(lambda s, p: traced.update(grads, s, p))(traced.init(params), params)
    with pytest.raises(ValueError, match=r"Masked\(optimizer=\.\.\.\)"):
        eqxopt.Masked(optax.adam(0.1), True)  # pyright: ignore
    # grads that do not fit the params the mask was resolved on
    opt = eqxopt.Masked(eqxopt.Adam(0.1), True)
    state = opt.init(params)
    del grads["conv"]
    with pytest.raises(ValueError, match="same tree structure"):
        opt.update(grads, state, params)


def test_partition_errors():
    params = make_params()
    adam, sgd = eqxopt.Adam(0.1), eqxopt.SGD(0.1)
    tree = {"linear": "a", "conv": "b", "scale": "c"}
    # Labels given as a tree: checked at construction.
    with pytest.raises(ValueError, match=r"no optimizer for the label.*'c'"):
        eqxopt.Partition({"a": adam, "b": sgd}, tree)
    with pytest.raises(ValueError, match=r"optimizer\(s\) 'd' get no param leaf"):
        eqxopt.Partition({"a": adam, "b": sgd, "c": sgd, "d": adam}, tree)
    # Labels given by a callable: checked at init.
    label = lambda p: "a" if p.ndim == 2 else "z"
    with pytest.raises(ValueError, match=r"no optimizer for the label.*'z'"):
        eqxopt.Partition({"a": adam, "b": sgd}, label).init(params)
    only_a = lambda p: "a"
    with pytest.raises(ValueError, match=r"optimizer\(s\) 'b' get no param leaf"):
        eqxopt.Partition({"a": adam, "b": sgd}, only_a).init(params)
    with pytest.raises(ValueError, match="PyTree prefix"):
        eqxopt.Partition({"a": adam}, {"linear": "a", "nope": "a"}).init(params)
    with pytest.raises(ValueError, match=r"no label \(None\).*\['scale'\]"):
        eqxopt.Partition({"a": adam}, {"linear": "a", "conv": "a", "scale": None}).init(
            params
        )
    with pytest.raises(ValueError, match="non-empty dict"):
        eqxopt.Partition({}, "a")
    with pytest.raises(ValueError, match=r"optimizers\['a'\]"):
        eqxopt.Partition({"a": optax.adam(0.1)}, "a")  # pyright: ignore


# --- ZeroNans and ApplyIfFinite ------------------------------------------------------


def test_zero_nans_flags_stay_bool():
    params = {"x": jnp.zeros((3,), jnp.bfloat16), "n": None, "i": 3}
    opt = eqxopt.ZeroNans()
    state = opt.init(params)
    assert state.found_nan["x"].dtype == jnp.bool_ and state.found_nan["n"] is None
    grads = {"x": jnp.array([1.0, jnp.nan, 2.0], jnp.float32), "n": None, "i": None}
    updates, state = eqx.filter_jit(opt.update)(grads, state, params)
    assert updates["x"].dtype == jnp.bfloat16
    assert jnp.array_equal(updates["x"], jnp.array([1.0, 0.0, 2.0], jnp.bfloat16))
    assert bool(state.found_nan["x"]) and state.found_nan["x"].dtype == jnp.bool_


def test_apply_if_finite_matches_optax():
    params = {"w": jnp.ones((3,), jnp.float32), "b": jnp.zeros((2,), jnp.float32)}
    opt = eqxopt.ApplyIfFinite(eqxopt.Adam(0.1, b1=0.5), max_consecutive_errors=2)
    ref = optax.apply_if_finite(optax.adam(0.1, b1=0.5), max_consecutive_errors=2)
    good = random_like(jr.key(0), params)
    nan = {**good, "w": good["w"].at[0].set(jnp.nan)}
    inf = {**good, "b": good["b"].at[1].set(jnp.inf)}
    sequence = [good, nan, inf, good, nan, nan, nan, good]
    # (skipped?, notfinite_count, total_notfinite) after each step
    expected = [
        (False, 0, 0),
        (True, 1, 1),
        (True, 2, 2),
        (False, 0, 2),
        (True, 1, 3),
        (True, 2, 4),
        (False, 3, 5),  # more than 2 in a row: let through, as Optax
        (False, 0, 5),
    ]
    step = eqx.filter_jit(opt.update)
    state, s_ref = opt.init(params), ref.init(params)
    init_avals = avals(state)
    p = params
    for grads, (skipped, count, total) in zip(sequence, expected):
        updates, new_state = step(grads, state, p)
        with jax.numpy_dtype_promotion("standard"):
            u_ref, s_ref = ref.update(grads, s_ref, p)
        assert avals(new_state) == init_avals
        assert (int(new_state.notfinite_count), int(new_state.total_notfinite)) == (
            count,
            total,
        )
        assert bool(new_state.last_finite) == (grads is good)
        if skipped:
            assert all(jnp.all(u == 0) for u in jtu.tree_leaves(updates))
            assert eqx.tree_equal(new_state.inner_state, state.inner_state)
        # NaN where Optax has NaN: the let-through step applies the NaN grads. rtol:
        # under x64 Optax computes Adam's bias correction 1 - b2**t in float64.
        _assert_close(updates, u_ref, rtol=1e-4, atol=1e-7)
        p = eqx.apply_updates(p, updates)
        state = new_state
    assert int(state.inner_state.count) == 4  # the 3 good steps and the let-through
    assert opt.hyperparams(state)["optimizer"]["b1"] == 0.5
    with pytest.raises(ValueError, match="max_consecutive_errors"):
        eqxopt.ApplyIfFinite(eqxopt.Adam(0.1), -1)


@pytest.mark.parametrize("inner", ["zero_nans_adam", "apply_if_finite_adam"])
def test_multisteps_state_stays_finite_after_nan_windows(inner):
    """After an all-NaN window and a partly-NaN window, every float leaf of the state
    is finite, and the next window's update is the inner optimizer's own update for
    that window's mean (nothing of the NaN windows leaks)."""
    if inner == "zero_nans_adam":
        opt_inner = eqxopt.Chain(eqxopt.ZeroNans(), eqxopt.Adam(0.1))
    else:
        opt_inner = eqxopt.ApplyIfFinite(eqxopt.Adam(0.1), max_consecutive_errors=5)
    k = 3
    opt = eqxopt.MultiSteps(opt_inner, every_k=k)
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    nan = jax.tree.map(lambda p: jnp.full_like(p, jnp.nan), params)
    part = {"w": params["w"].at[0, 1].set(jnp.nan), "b": jnp.ones(3)}
    clean = [jax.tree.map(lambda p, i=i: p + 0.5 * i - 1.0, params) for i in range(k)]
    step = eqx.filter_jit(opt.update)
    state = opt.init(params)
    for g in [nan] * k + [part, params, params]:  # an all-NaN, then a partly-NaN window
        _, state = step(g, state, params)
        assert not opt.has_updated(state) or all(
            bool(jnp.all(jnp.isfinite(x)))
            for x in jax.tree.leaves(state)
            if jnp.issubdtype(x.dtype, jnp.inexact)
        )
    floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.inexact)]
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in floats)
    assert all(bool(jnp.all(a == 0)) for a in jax.tree.leaves(state.acc_grads))
    before = state.inner_state
    updates = None
    for g in clean:
        updates, state = step(g, state, params)
    mean = jax.tree.map(lambda *gs: sum(gs) / k, *clean)
    expected, _ = opt_inner.update(mean, before, params)
    assert tree_allclose(updates, expected, rtol=1e-6, atol=1e-7)


# The adversarial optimizers of two SAMs: stateless (the paper's: SAM computes both
# steps and selects one) and with a momentum buffer (SAM runs only the step it needs,
# in a `lax.cond`).
_SAM_ADV = {
    "stateless": lambda: eqxopt.Chain(eqxopt.Normalize(), eqxopt.SGD(0.05)),
    "momentum": lambda: eqxopt.Chain(
        eqxopt.Normalize(), eqxopt.SGD(0.05, momentum=0.5)
    ),
}


def _c_adam_reference(params, grads_seq, lr, b1, b2, eps):
    """`AdamW.step` of `c_adamw.py` (`correct_bias=True`, `weight_decay=0`), NumPy."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    out = []
    for step, grads in enumerate(grads_seq, start=1):
        for k in p:
            grad = np.asarray(grads[k], np.float64)
            m[k] = m[k] * b1 + grad * (1.0 - b1)
            v[k] = v[k] * b2 + grad * grad * (1.0 - b2)
            denom = np.sqrt(v[k]) + eps
            step_size = lr * np.sqrt(1.0 - b2**step) / (1.0 - b1**step)
            mask = (m[k] * grad > 0).astype(grad.dtype)
            mask = mask / max(mask.mean(), 1e-3)
            p[k] = p[k] + (m[k] * mask) / denom * -step_size
        out.append({k: x.copy() for k, x in p.items()})
    return out


@pytest.mark.parametrize(
    "dtype, real", [(jnp.complex64, jnp.float32), (jnp.complex128, jnp.float64)]
)
@pytest.mark.parametrize(
    "inner, reference",
    [
        (lambda: eqxopt.Adam(1e-2), lambda: optax.adam(1e-2)),
        (
            lambda: eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.SGD(0.1, 0.9)),
            lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, 0.9)),
        ),
    ],
    ids=["adam", "chain_clip_sgd"],
)
def test_split_real_and_imaginary_on_complex_params(inner, reference, dtype, real):
    keys = jr.split(jr.key(0), 2)
    real_params = make_params(real, key=keys[0])
    imag_params = make_params(real, key=keys[1])
    params = jax.tree.map(lambda a, b: jax.lax.complex(a, b), real_params, imag_params)
    assert all(p.dtype == dtype for p in jax.tree.leaves(params))
    params["real_leaf"] = jnp.linspace(-1.0, 1.0, 4, dtype=real)  # passes through
    ours = eqxopt.SplitRealAndImaginary(inner())
    ref = optax.contrib.split_real_and_imaginary(reference())
    s_ours, s_ref = ours.init(params), ref.init(params)
    # The inner state is real: a complex leaf's buffers are a `.real` and an
    # `.imaginary` part in the real dtype.
    for leaf in jax.tree.leaves(s_ours):
        assert not jnp.iscomplexobj(leaf)
    step = eqx.filter_jit(ours.update)
    p_ours = p_ref = params
    key = jr.key(1)
    rtol = 1e-6 if real == jnp.float32 else 1e-12
    for i in range(5):
        key, k1, k2 = jr.split(key, 3)
        grads = jax.tree.map(
            lambda a, b, p: jax.lax.complex(a, b) if jnp.iscomplexobj(p) else a,
            random_like(k1, real_params | {"real_leaf": params["real_leaf"]}),
            random_like(k2, real_params | {"real_leaf": params["real_leaf"]}),
            params,
        )
        u_ours, s_ours = step(grads, s_ours, p_ours)
        with jax.numpy_dtype_promotion("standard"):  # Optax is not strict-clean
            u_ref, s_ref = ref.update(grads, s_ref, p_ref)
        # Updates keep each param's dtype (complex stays complex, real stays real).
        assert jax.tree.map(lambda u: u.dtype, u_ours) == jax.tree.map(
            lambda p: p.dtype, params
        )
        p_ours = eqx.apply_updates(p_ours, u_ours)
        p_ref = optax.apply_updates(p_ref, u_ref)
        assert tree_allclose(p_ours, p_ref, rtol=rtol, atol=1e-7), f"step {i}"


def test_split_real_and_imaginary_descends_on_a_complex_loss():
    target = jnp.array([2 + 1j, -1 + 0.5j, 0.25j], jnp.complex64)
    params = {"z": jnp.zeros(3, jnp.complex64)}
    loss = lambda p: jnp.sum(jnp.abs(p["z"] - target) ** 2)
    opt = eqxopt.SplitRealAndImaginary(eqxopt.Adam(0.1))
    state = opt.init(params)
    for _ in range(200):
        grads = jax.tree.map(jnp.conj, jax.grad(loss)(params))
        params, state = opt.step(params, grads, state)
        assert isinstance(state, eqxopt.SplitRealAndImaginaryState)
    assert jnp.allclose(params["z"], target, atol=2e-2)


def test_transparent_sam_needs_no_extra_argument():
    opt = eqxopt.SAM(eqxopt.SGD(0.1), eqxopt.SGD(0.1))
    params = make_params()
    updates, _ = opt.update(params, opt.init(params), params)
    assert jtu.tree_structure(updates) == jtu.tree_structure(params)


@pytest.mark.parametrize("adv", list(_SAM_ADV))
def test_sam_unused_step_nan_does_not_leak(adv):
    # A zero gradient at the outer step: the adversarial optimizer's normalisation
    # divides 0 by 0 there. That step is not used, so the update is the outer SGD's
    # (back to the cached params, then -lr * 0): finite. Optax blends the two steps by
    # multiplying with 0 and 1, so its update is NaN.
    params = make_params()
    grads = random_like(jr.key(1), params)
    zeros = jtu.tree_map(jnp.zeros_like, params)
    opt = eqxopt.SAM(eqxopt.SGD(0.1), _SAM_ADV[adv]())
    step = eqx.filter_jit(opt.step)
    state = opt.init(params)
    adv_params, state = step(params, grads, state)  # the adversarial step
    outer_params, state = step(adv_params, zeros, state)  # the outer step
    for p, q in zip(jtu.tree_leaves(params), jtu.tree_leaves(outer_params)):
        # `adv_params + (params - adv_params + 0)`: equal up to the rounding of the
        # subtraction and the addition.
        np.testing.assert_allclose(q, p, rtol=0, atol=1e-6)

    tx = optax.contrib.sam(
        optax.sgd(0.1), optax.chain(optax.contrib.normalize(), optax.sgd(0.05))
    )
    with jax.numpy_dtype_promotion("standard"):  # Optax is not strict-clean
        s = tx.init(params)
        _, s = tx.update(grads, s, params)
        u, _ = tx.update(zeros, s, adv_params)
    assert all(jnp.isnan(x).all() for x in jtu.tree_leaves(u))


@pytest.mark.parametrize("adv", list(_SAM_ADV))
def test_sam_cond_only_when_an_optimizer_has_state_buffers(adv):
    # Performance contract (benchmarks/update.py, issue 17): with no state buffer to
    # skip, SAM selects between the two steps, which XLA fuses with the caller's
    # `apply_updates`; a `lax.cond` would cost one more pass over the params (1.2-1.5x
    # Optax's step time on CPU). With buffers, the `cond` skips reading and writing
    # them on the steps that do not use them.
    params = make_params()
    opt = eqxopt.SAM(eqxopt.SGD(0.1), _SAM_ADV[adv]())
    jaxpr = str(jax.make_jaxpr(opt.update)(params, opt.init(params), params))
    assert ("cond[" in jaxpr) == (adv == "momentum")


def test_cautious_adam_matches_reference():
    """`Cautious(Adam(lr))` is C-Adam. Both use `eps=0`: the reference adds `eps`
    before the bias correction of the second moment and Optax's Adam after it, a
    difference of Adam's, not of the cautious mask."""
    params = make_params(jnp.float64, {"w": (5, 3), "b": (5,), "k": (2, 3, 4)})
    keys = jr.split(jr.key(4), 6)
    grads_seq = [random_like(k, params) for k in keys]
    expected = _c_adam_reference(params, grads_seq, lr=1e-2, b1=0.9, b2=0.999, eps=0.0)
    opt = eqxopt.Cautious(eqxopt.Adam(1e-2, eps=0.0))
    state = opt.init(params)
    step = eqx.filter_jit(opt.step)
    masked_some = False
    for i, grads in enumerate(grads_seq):
        updates, _ = opt.update(grads, state, params)
        masked_some |= any(bool(jnp.any(u == 0)) for u in jtu.tree_leaves(updates))
        params, state = step(params, grads, state)
        for k in params:
            np.testing.assert_allclose(
                params[k], expected[i][k], rtol=1e-12, atol=1e-14, err_msg=f"{i} {k}"
            )
    assert masked_some  # the test exercised the mask


def test_cautious_mask_and_rescaling():
    params = {"w": jnp.zeros(4)}
    grads = {"w": jnp.array([1.0, -2.0, 3.0, -4.0])}
    sgd = eqxopt.Cautious(eqxopt.SGD(0.1))
    updates, _ = sgd.update(grads, sgd.init(params), params)
    assert jnp.allclose(updates["w"], -0.1 * grads["w"])  # all kept, scale 1
    ascent = eqxopt.Cautious(eqxopt.Scale(0.1))  # ascent: every entry disagrees
    updates, _ = ascent.update(grads, ascent.init(params), params)
    assert jnp.array_equal(updates["w"], jnp.zeros(4))
    # Momentum from a first step keeps the update's sign where the new gradient
    # flipped: half the entries disagree, the other half is doubled (1 / mean(mask)).
    momentum = eqxopt.Cautious(eqxopt.SGD(0.1, momentum=0.9))
    state = momentum.init(params)
    _, state = momentum.update({"w": jnp.ones(4)}, state, params)
    g2 = {"w": jnp.array([-0.5, 0.5, -0.5, 0.5])}
    updates, _ = momentum.update(g2, state, params)
    assert jnp.allclose(updates["w"], jnp.array([0.0, -0.28, 0.0, -0.28]))


def test_lookahead_matches_plain_loop_and_exposes_slow_params():
    rng = np.random.default_rng(3)
    p0 = rng.normal(size=(6,))
    targets = [rng.normal(size=(6,)) for _ in range(7)]
    lr, k, alpha = 0.3, 3, 0.5
    opt = eqxopt.Lookahead(eqxopt.SGD(lr), sync_period=k, slow_step_size=alpha)
    x = jnp.asarray(p0)
    state = opt.init(x)
    fast, slow = p0.copy(), p0.copy()
    for i, t in enumerate(targets):
        g = fast - t
        x, state = opt.step(x, jnp.asarray(g), state)
        fast = fast - lr * g
        if (i + 1) % k == 0:
            slow = slow + alpha * (fast - slow)
            fast = slow.copy()
        np.testing.assert_allclose(np.asarray(x), fast, rtol=1e-10)
        np.testing.assert_allclose(
            np.asarray(opt.eval_params(state, x)), slow, rtol=1e-10
        )
    hp = opt.hyperparams(state)
    assert hp["slow_step_size"] == alpha and hp["fast_optimizer"]["learning_rate"] == lr


def test_params_ema_is_the_debiased_average_of_the_iterates():
    rng = np.random.default_rng(4)
    decay = 0.8
    p = rng.normal(size=(3, 2))
    inner = eqxopt.SGD(0.1, momentum=0.5)
    opt = eqxopt.ParamsEMA(inner, decay=decay)
    x = {"w": jnp.asarray(p), "act": jax.nn.relu}  # non-array leaves pass through
    state = opt.init(x)
    assert opt.eval_params(state, x)["w"] is not None
    np.testing.assert_array_equal(np.asarray(opt.eval_params(state, x)["w"]), p)
    iterates = []
    s_inner = inner.init(x)
    y = x
    for _ in range(5):
        g = {"w": jnp.asarray(rng.normal(size=p.shape)), "act": None}
        x, state = opt.step(x, g, state)
        y, s_inner = inner.step(y, g, s_inner)  # the updates pass through unchanged
        np.testing.assert_array_equal(np.asarray(x["w"]), np.asarray(y["w"]))
        iterates.append(np.asarray(x["w"]))
    weights = np.array([(1 - decay) * decay ** (4 - i) for i in range(5)])
    expected = sum(w * it for w, it in zip(weights, iterates)) / (1 - decay**5)
    averaged = opt.eval_params(state, x)
    assert averaged["act"] is jax.nn.relu
    np.testing.assert_allclose(np.asarray(averaged["w"]), expected, rtol=1e-10)
    # Without debiasing the average starts from the initial params.
    opt2 = eqxopt.ParamsEMA(inner, decay=decay, debias=False)
    z = {"w": jnp.asarray(p)}
    s2 = opt2.init(z)
    g = {"w": jnp.ones(p.shape, p.dtype)}
    z, s2 = opt2.step(z, g, s2)
    np.testing.assert_allclose(
        np.asarray(opt2.eval_params(s2, z)["w"]),
        decay * p + (1 - decay) * np.asarray(z["w"]),
        rtol=1e-12,
    )


def test_params_ema_float32_average_for_bfloat16_params():
    x = {"w": jnp.ones((4,), jnp.bfloat16)}
    opt = eqxopt.ParamsEMA(eqxopt.SGD(1e-3), decay=0.999, state_dtype=jnp.float32)
    state = opt.init(x)
    assert state.ema["w"].dtype == jnp.float32
    for _ in range(3):
        x, state = opt.step(x, {"w": jnp.ones((4,), jnp.bfloat16)}, state)
    out = opt.eval_params(state, x)
    assert out["w"].dtype == jnp.bfloat16
