"""Schedule-free optimizers (issue 5): Optax parity (no warm-up) including `z` and
`eval_params`, the reference implementation's warm-up rule (written out in NumPy),
typed state, and the scenario that broke Optax: `MultiSteps(ScheduleFreeAdamW)` with
bfloat16/float16 params under `filter_jit` and `lax.scan`."""

import functools as ft
from typing import Any, cast

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

from .helpers import avals, make_params, random_like, tree_allclose


# --- parity with Optax (no warm-up): params, z and eval_params, 20 steps, float32 ----


_PARITY = {
    "sgd": (
        lambda: eqxopt.ScheduleFreeSGD(
            0.2, b1=0.8, weight_decay=1e-2, weight_lr_power=1.5
        ),
        lambda: optax.contrib.schedule_free_sgd(
            0.2, b1=0.8, weight_decay=1e-2, weight_lr_power=1.5
        ),
    ),
    "adamw": (
        lambda: eqxopt.ScheduleFreeAdamW(
            2e-2, b1=0.85, b2=0.99, eps=1e-6, weight_decay=0.05, weight_lr_power=1.0
        ),
        lambda: optax.contrib.schedule_free_adamw(
            2e-2, b1=0.85, b2=0.99, eps=1e-6, weight_decay=0.05, weight_lr_power=1.0
        ),
    ),
    "wrap_adam": (
        lambda: eqxopt.ScheduleFree(
            eqxopt.Adam(1e-2, b1=0.0, b2=0.98), 1e-2, b1=0.95, weight_lr_power=2.5
        ),
        lambda: optax.contrib.schedule_free(
            optax.adam(1e-2, b1=0.0, b2=0.98), 1e-2, b1=0.95, weight_lr_power=2.5
        ),
    ),
}


@pytest.mark.parametrize("name", list(_PARITY))
def test_matches_optax_with_z_and_eval_params(name):
    make, make_ref = _PARITY[name]
    opt, ref = make(), make_ref()
    params = make_params(jnp.float32)
    s, s_ref = opt.init(params), ref.init(params)
    p = p_ref = params
    step = eqx.filter_jit(opt.update)
    ref_step = jax.jit(ref.update)
    key = jr.key(7)
    # Optax rebuilds y from x = (y - (1 - b1) z) / b1, we step y directly: float32
    # rounding differs by a few ulps.
    tol = dict(rtol=1e-5, atol=1e-6)
    for _ in range(20):
        key, sub = jr.split(key)
        grads = random_like(sub, params)
        u, s = step(grads, s, p)
        with jax.numpy_dtype_promotion("standard"):
            u_ref, s_ref = ref_step(grads, s_ref, p_ref)
        p, p_ref = eqx.apply_updates(p, u), optax.apply_updates(p_ref, u_ref)
        assert tree_allclose(p, p_ref, **tol)
        assert tree_allclose(s.z, s_ref.z, **tol)
        assert tree_allclose(s.weight_sum, s_ref.weight_sum.astype(jnp.float32))
        with jax.numpy_dtype_promotion("standard"):
            x_ref = optax.contrib.schedule_free_eval_params(s_ref, p_ref)
        assert tree_allclose(opt.eval_params(s, p), x_ref, **tol)


# --- warm-up: the reference implementation's rule, written out ----------------------


def _target():
    return {"a": np.linspace(-1.0, 2.0, 6), "b": np.array([[0.5, -3.0], [2.0, 1.0]])}


def _grad(y, noise):
    """Gradient of a quadratic with a per-step perturbation (NumPy or JAX leaves)."""
    return jtu.tree_map(lambda yi, t, n: 2.0 * (yi - t) + n, y, _target(), noise)


def _noises(steps):
    rng = np.random.default_rng(0)
    return [
        jtu.tree_map(lambda t: rng.normal(size=t.shape), _target())
        for _ in range(steps)
    ]


def _reference(kind, y0, noises, *, lr, warmup, b1, wd, power, b2=0.999, eps=1e-8):
    """facebookresearch/schedule_free's SGDScheduleFree / AdamWScheduleFree, leaf by
    leaf in float64: the k-th step (k from 0) uses lr * (k + 1) / warmup for both the
    z step and the averaging weight."""
    y = {k: v.copy() for k, v in y0.items()}
    z = {k: v.copy() for k, v in y0.items()}
    x = {k: v.copy() for k, v in y0.items()}
    v = {k: np.zeros_like(a) for k, a in y0.items()}
    lr_max, weight_sum = -1.0, 0.0
    ys, xs = [], []
    for k, noise in enumerate(noises):
        sched = (k + 1) / warmup if k < warmup else 1.0
        lr_k = lr * sched
        lr_max = max(lr_k, lr_max)
        weight = lr_max**power
        weight_sum = weight_sum + weight
        ckp1 = weight / weight_sum if weight_sum != 0 else 0.0
        g = _grad(y, noise)
        for name in y:
            if kind == "sgd":
                d = g[name] + wd * y[name]
            else:
                v[name] = b2 * v[name] + (1 - b2) * g[name] ** 2
                denom = np.sqrt(v[name] / (1 - b2 ** (k + 1))) + eps
                d = g[name] / denom + wd * y[name]
            z[name] = z[name] - lr_k * d
            x[name] = (1 - ckp1) * x[name] + ckp1 * z[name]
            y[name] = b1 * x[name] + (1 - b1) * z[name]
        ys.append({n: a.copy() for n, a in y.items()})
        xs.append({n: a.copy() for n, a in x.items()})
    return ys, xs


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_warmup_follows_reference(kind):
    steps, warmup = 9, 4
    hyper = dict(lr=0.1, warmup=warmup, b1=0.8, wd=0.03, power=1.5)
    # Either optimizer; `Any` as pyright cannot pair a union's `update` with its state.
    opt: Any
    if kind == "sgd":
        opt = eqxopt.ScheduleFreeSGD(
            0.1, warmup_steps=warmup, b1=0.8, weight_decay=0.03, weight_lr_power=1.5
        )
    else:
        opt = eqxopt.ScheduleFreeAdamW(
            0.1,
            warmup_steps=warmup,
            b1=0.8,
            b2=0.95,
            eps=1e-6,
            weight_decay=0.03,
            weight_lr_power=1.5,
        )
        hyper.update(b2=0.95, eps=1e-6)
    y0 = jtu.tree_map(lambda t: 0.25 * t - 0.5, _target())
    noises = _noises(steps)
    ys_ref, xs_ref = _reference(kind, y0, noises, **hyper)

    params = jtu.tree_map(jnp.asarray, y0)
    state = opt.init(params)
    step = eqx.filter_jit(opt.update)
    for k in range(steps):
        grads = _grad(params, jtu.tree_map(jnp.asarray, noises[k]))
        updates, state = step(grads, state, params)
        params = eqx.apply_updates(params, updates)
        expected_y = jtu.tree_map(jnp.asarray, ys_ref[k])
        expected_x = jtu.tree_map(jnp.asarray, xs_ref[k])
        assert tree_allclose(params, expected_y, rtol=1e-10, atol=1e-12), k
        x = opt.eval_params(state, params)
        assert tree_allclose(x, expected_x, rtol=1e-10, atol=1e-12), k


def test_warmup_first_step_differs_from_optax():
    """Optax steps z with lr * k / warmup_steps (an off-by-one): its first z step is
    exactly zero. The reference (and eqxopt) step with lr * (k + 1) / warmup_steps."""
    params = make_params(jnp.float32)
    grads = random_like(jr.key(0), params)
    lr, warmup = 0.1, 5
    ref = optax.contrib.schedule_free_sgd(lr, warmup_steps=warmup, b1=0.9)
    with jax.numpy_dtype_promotion("standard"):
        u_ref, s_ref = ref.update(grads, ref.init(params), params)
    s_ref = cast(optax.contrib.ScheduleFreeState, s_ref)
    assert eqx.tree_equal(s_ref.z, params)  # z did not move
    assert tree_allclose(u_ref, jtu.tree_map(jnp.zeros_like, params), atol=1e-6)

    opt = eqxopt.ScheduleFreeSGD(lr, warmup_steps=warmup, b1=0.9)
    u, state = opt.update(grads, opt.init(params), params)
    # First step: c = 1, so y' = x' = z' = y - (lr / warmup) g.
    expected = jtu.tree_map(lambda g: -(lr / warmup) * g, grads)
    assert tree_allclose(u, expected, rtol=1e-6, atol=1e-7)
    new_params = eqx.apply_updates(params, u)
    assert tree_allclose(state.z, new_params, rtol=1e-6, atol=1e-7)
    assert tree_allclose(
        opt.eval_params(state, new_params), new_params, rtol=1e-6, atol=1e-6
    )


def test_wrapper_schedule_is_evaluated_at_updates_applied():
    """A scheduled `learning_rate` in the wrapper is evaluated at k (updates already
    applied), as the inner optimizer evaluates the same schedule: both use lr(k)."""
    schedule = eqxopt.schedules.Linear(0.02, 0.1, 4)
    opt = eqxopt.ScheduleFree(eqxopt.SGD(schedule), schedule, b1=0.8)
    lrs = [0.02 + (0.1 - 0.02) * min(k, 4) / 4 for k in range(6)]
    y0 = jtu.tree_map(lambda t: 0.25 * t - 0.5, _target())
    noises = _noises(6)
    # The reference loop with lr_k = lrs[k] (no warm-up factor, power 2, no decay).
    y = {n: a.copy() for n, a in y0.items()}
    z = {n: a.copy() for n, a in y0.items()}
    x = {n: a.copy() for n, a in y0.items()}
    lr_max, weight_sum, ys = -1.0, 0.0, []
    for k in range(6):
        lr_max = max(lrs[k], lr_max)
        weight_sum += lr_max**2
        c = lr_max**2 / weight_sum
        g = _grad(y, noises[k])
        for n in y:
            z[n] = z[n] - lrs[k] * g[n]
            x[n] = (1 - c) * x[n] + c * z[n]
            y[n] = 0.8 * x[n] + 0.2 * z[n]
        ys.append({n: a.copy() for n, a in y.items()})

    params = jtu.tree_map(jnp.asarray, y0)
    state = opt.init(params)
    for k in range(6):
        grads = _grad(params, jtu.tree_map(jnp.asarray, noises[k]))
        params, state = opt.step(params, grads, state)
        expected = jtu.tree_map(jnp.asarray, ys[k])
        assert tree_allclose(params, expected, rtol=1e-6, atol=1e-6), k
    hp = opt.hyperparams(state)
    assert jnp.allclose(hp["learning_rate"], 0.1)
    assert jnp.allclose(hp["optimizer"]["learning_rate"], 0.1)
    assert hp["b1"] == 0.8 and hp["weight_lr_power"] == 2.0


# --- state types ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64])
@pytest.mark.parametrize("state_dtype", [None, jnp.float32])
def test_state_types(dtype, state_dtype):
    params = make_params(dtype)
    scalar_dtype = jnp.float64 if dtype == jnp.float64 else jnp.float32
    z_dtype = dtype if state_dtype is None else state_dtype
    for opt in (
        eqxopt.ScheduleFreeSGD(0.1, state_dtype=state_dtype),
        eqxopt.ScheduleFreeAdamW(1e-2, warmup_steps=3, state_dtype=state_dtype),
        eqxopt.ScheduleFree(eqxopt.SGD(0.1), 0.1, state_dtype=state_dtype),
    ):
        state = opt.init(params)
        assert state.count.dtype == jnp.int32
        for leaf in (state.max_lr, state.weight_sum):
            assert leaf.shape == () and leaf.dtype == scalar_dtype
        assert all(z.dtype == z_dtype for z in jtu.tree_leaves(state.z))
        assert all(not jax.typeof(x).weak_type for x in jtu.tree_leaves(state))
        # f32 grads for low-precision params: the state and the updates keep types.
        grads = random_like(jr.key(0), params, jnp.float32)
        updates, new_state = eqx.filter_eval_shape(opt.update, grads, state, params)
        assert avals(new_state) == avals(state)
        assert all(u.dtype == dtype for u in jtu.tree_leaves(updates))
        x = eqx.filter_eval_shape(opt.eval_params, new_state, params)
        assert all(xi.dtype == dtype for xi in jtu.tree_leaves(x))


def test_eval_params_of_a_whole_model():
    model = eqx.nn.MLP(3, 2, 8, 1, key=jr.key(0), dtype=jnp.bfloat16)
    opt = eqxopt.ScheduleFreeAdamW(1e-2)
    state = opt.init(model)
    x = jr.normal(jr.key(1), (4, 3), jnp.bfloat16)
    loss = lambda m: jnp.mean(jax.vmap(m)(x).astype(jnp.float32) ** 2)
    step = eqx.filter_jit(lambda m, s: opt.step(m, eqx.filter_grad(loss)(m), s))
    for _ in range(3):
        model, state = step(model, state)
    averaged = eqx.filter_jit(opt.eval_params)(state, model)
    assert jtu.tree_structure(averaged) == jtu.tree_structure(model)
    assert averaged.activation is model.activation
    assert averaged.layers[0].weight.dtype == jnp.bfloat16
    assert not eqx.tree_equal(averaged, model)  # x differs from y after a few steps
    with pytest.raises(ValueError, match="same tree structure"):
        opt.eval_params(state, {"not": jnp.zeros(3)})


def test_errors():
    with pytest.raises(ValueError, match=r"b1"):
        eqxopt.ScheduleFreeSGD(0.1, b1=0.0)
    with pytest.raises(ValueError, match=r"b1"):
        eqxopt.ScheduleFreeAdamW(0.1, b1=1.5)
    with pytest.raises(ValueError, match=r"b2"):
        eqxopt.ScheduleFreeAdamW(0.1, b2=1.0)
    with pytest.raises(ValueError, match=r"warmup_steps"):
        eqxopt.ScheduleFreeAdamW(0.1, warmup_steps=-1)
    with pytest.raises(ValueError, match=r"learning_rate"):
        eqxopt.ScheduleFree(eqxopt.SGD(0.1), -0.1)
    with pytest.raises(ValueError, match=r"eqxopt optimizer"):
        eqxopt.ScheduleFree(optax.sgd(0.1), 0.1)  # pyright: ignore
    params = make_params()
    opt = eqxopt.ScheduleFreeSGD(0.1)
    with pytest.raises(ValueError, match="needs `params`"):
        opt.update(params, opt.init(params))


# --- the scenario that broke Optax: MultiSteps(ScheduleFreeAdamW), low precision -----


def _quadratic(params):
    def leaf(p):
        weights = 1.0 + (jnp.arange(p.size) % 3).astype(jnp.float32).reshape(p.shape)
        return jnp.sum(weights * (p.astype(jnp.float32) - 0.5) ** 2)

    return sum(leaf(p) for p in jtu.tree_leaves(params))


def _multisteps_run(dtype, grad_dtype, state_dtype, *, scan: bool, steps=40):
    """40 calls of MultiSteps(ScheduleFreeAdamW, every_k=2) on a noisy quadratic,
    under `filter_jit` call by call and (if `scan`) as one `lax.scan`. Checks the
    state's types after every call; returns the averaged points and the final state."""
    inner = eqxopt.ScheduleFreeAdamW(
        0.2, warmup_steps=4, weight_decay=1e-3, state_dtype=state_dtype
    )
    opt = eqxopt.MultiSteps(inner, every_k=2)
    params = make_params(dtype)
    state = opt.init(params)
    init_avals = avals(state)
    noise = random_like(jr.key(3), params, jnp.float32)

    def grads_at(params, i):
        g = jax.grad(_quadratic)(params)
        scale = jnp.where(i % 2 == 0, 0.3, -0.3).astype(jnp.float32)
        return jtu.tree_map(
            lambda g, n: (g.astype(jnp.float32) + scale * n).astype(
                grad_dtype or g.dtype
            ),
            g,
            noise,
        )

    @eqx.filter_jit
    def step(params, state, i):
        params, state = opt.step(params, grads_at(params, i), state)
        return params, state

    # Under filter_jit, call by call.
    p, s = params, state
    for i in range(steps):
        p, s = step(p, s, jnp.asarray(i, jnp.int32))
        assert avals(s) == init_avals
    assert all(x.dtype == dtype for x in jtu.tree_leaves(p))
    x = inner.eval_params(s.inner_state, p)
    if not scan:
        return x, None, s

    # Inside lax.scan: the whole state is the carry.
    def body(carry, i):
        p, s = carry
        return step(p, s, i), None

    (p_scan, s_scan), _ = jax.jit(
        lambda c: lax.scan(body, c, jnp.arange(steps, dtype=jnp.int32))
    )((params, state))
    assert avals(s_scan) == init_avals
    assert all(x.dtype == dtype for x in jtu.tree_leaves(p_scan))
    x_scan = inner.eval_params(s_scan.inner_state, p_scan)
    return x, x_scan, s


@ft.cache
def _float32_run():
    return _multisteps_run(jnp.float32, None, None, scan=False)[0]


@pytest.mark.parametrize(
    "dtype,grad_dtype,state_dtype",
    [
        (jnp.bfloat16, None, None),
        (jnp.bfloat16, jnp.float32, jnp.float32),
        (jnp.float16, None, None),
    ],
    ids=["bf16", "bf16-f32grads-f32state", "f16"],
)
def test_multisteps_schedule_free_low_precision(dtype, grad_dtype, state_dtype):
    """Optax (0.2.4-0.2.8) failed here: float32 state met bfloat16 params and
    `lax.cond` rejected MultiSteps' branches."""
    x, x_scan, state = _multisteps_run(dtype, grad_dtype, state_dtype, scan=True)
    x32 = _float32_run()
    inner = state.inner_state
    assert int(inner.count) == 20 and int(state.gradient_step) == 20
    assert inner.max_lr.dtype == jnp.float32 and inner.weight_sum.dtype == jnp.float32
    # The low-precision run tracks the float32 one: after 40 calls (20 updates) the
    # averaged points agree to within 0.03 on values of order 1 (a bfloat16 ulp is
    # 2^-8 ~ 0.004 there; observed: 0.008), and the scanned run agrees with the
    # call-by-call one (observed: exactly).
    for a, b, c in zip(
        jtu.tree_leaves(x), jtu.tree_leaves(x_scan), jtu.tree_leaves(x32)
    ):
        a32, b32 = a.astype(jnp.float32), b.astype(jnp.float32)
        assert jnp.all(jnp.isfinite(a32))
        assert jnp.max(jnp.abs(a32 - c)) < 0.03
        assert jnp.max(jnp.abs(a32 - b32)) < 0.01
    # ...and the float32 run itself moved well towards the minimum at 0.5.
    dist = lambda t: max(float(jnp.max(jnp.abs(l - 0.5))) for l in jtu.tree_leaves(t))
    assert dist(x32) < 0.5 * dist(make_params(jnp.float32))
