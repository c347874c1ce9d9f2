"""Wrappers (API.md section 3): `ZeroNans`, `ApplyIfFinite`, `MultiSteps`, `Masked`,
`Partition`, and the Optax failures they rebuild.

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
    for _ in range(3):
        updates, state = opt.update(grads, state, params)
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
    for g in clean:
        updates, state = step(g, state, params)
    mean = jax.tree.map(lambda *gs: sum(gs) / k, *clean)
    expected, _ = opt_inner.update(mean, before, params)
    assert tree_allclose(updates, expected, rtol=1e-6, atol=1e-7)
