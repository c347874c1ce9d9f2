"""The adaptive family (`tests/registry/adaptive.py`), beyond what the registry gives
every entry: low-precision arithmetic, Adafactor's state layout, missing `params`, and
a few update rules checked against their papers, written in NumPy."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import pytest

import eqxopt

from .helpers import make_params
from .registry.adaptive import CASES, FACTOR_SHAPES


# --- low precision: arithmetic runs in float32, so tiny gradients still count ---------

# One case per optimizer (the `ScaleBy*` chains and variants share its arithmetic).
_SKIP = {"adafactor_relative_step", "adafactor_unscaled_unclipped", "adamaxw", "nadamw"}
_NAMED = [c for c in CASES if not c.id.startswith("chain_") and c.id not in _SKIP]


@pytest.mark.parametrize("case", _NAMED, ids=lambda c: c.id)
def test_float16_matches_float32_arithmetic(case):
    """float16 params with gradients ~1e-4 (whose squares underflow in float16): two
    steps must match the same steps done on float32 copies to float16 rounding, with
    no NaN or inf."""
    opt = case.make()
    params16 = make_params(jnp.float16, case.shapes)
    step = eqx.filter_jit(lambda g, s, p: opt.update(g, s, p))
    state16 = opt.init(params16)
    template32 = opt.init(jtu.tree_map(lambda x: x.astype(jnp.float32), params16))
    key = jr.key(0)
    for _ in range(2):
        # Both runs start each step from the same (float16-representable) params and
        # state: only the arithmetic inside the step may differ.
        params32 = jtu.tree_map(lambda x: x.astype(jnp.float32), params16)
        state32 = jtu.tree_map(lambda a, b: a.astype(b.dtype), state16, template32)
        key, sub = jr.split(key)
        leaves, treedef = jtu.tree_flatten(params16)
        keys = jr.split(sub, len(leaves))
        g16 = jtu.tree_unflatten(
            treedef,
            [
                (1e-4 * jr.normal(k, x.shape, jnp.float32)).astype(jnp.float16)
                for k, x in zip(keys, leaves)
            ],
        )
        g32 = jtu.tree_map(lambda x: x.astype(jnp.float32), g16)
        u16, state16 = step(g16, state16, params16)
        u32, _ = step(g32, state32, params32)
        for a, b in zip(jtu.tree_leaves(u16), jtu.tree_leaves(u32)):
            assert a.dtype == jnp.float16
            assert jnp.all(jnp.isfinite(a)), case.id
            scale = float(jnp.max(jnp.abs(b)))
            np.testing.assert_allclose(
                np.asarray(a, np.float32),
                np.asarray(b),
                rtol=2e-3,
                atol=2e-3 * scale + 1e-7,
            )
        params16 = eqx.apply_updates(params16, u16)


# --- Adafactor's factored state ----------------------------------------------------


def test_adafactor_state_layout():
    params = make_params(jnp.bfloat16, FACTOR_SHAPES)
    state = eqxopt.Adafactor(1e-2, min_dim_size_to_factor=4, momentum=0.9).init(params)
    # Factored over the two largest axes: row stats drop the largest, col stats the
    # second largest.
    assert state.v_row["w"].shape == (4,) and state.v_col["w"].shape == (6,)
    assert state.v_row["m3"].shape == (3, 4) and state.v_col["m3"].shape == (5, 3)
    for name in ("w", "m3"):
        assert state.v[name] is None
    for name in ("thin", "b", "s"):  # too small to factor
        assert state.v_row[name] is None and state.v_col[name] is None
        assert state.v[name].shape == FACTOR_SHAPES[name]
    assert all(x.dtype == jnp.bfloat16 for x in jtu.tree_leaves(state.momentum))
    # Optax's default threshold: nothing here is factored.
    default = eqxopt.Adafactor().init(params)
    assert all(x is None for x in jtu.tree_leaves(default.v_row, is_leaf=_is_none))
    assert default.momentum is None


def _is_none(x):
    return x is None


# --- `params` is required where the rule reads them ---------------------------------


@pytest.mark.parametrize(
    "opt",
    [
        eqxopt.Lamb(1e-3),
        eqxopt.Lars(0.1),
        eqxopt.Adafactor(),
        eqxopt.ScaleByTrustRatio(),
        eqxopt.Novograd(1e-2, weight_decay=1e-3),
        eqxopt.Lion(1e-3),
        eqxopt.AdamaxW(1e-3),
        eqxopt.NAdamW(1e-3),
    ],
    ids=lambda o: type(o).__name__,
)
def test_missing_params_is_a_clear_error(opt):
    params = {"w": jnp.ones((3, 2), jnp.float32)}
    with pytest.raises(ValueError, match="params"):
        opt.update(params, opt.init(params))


def test_no_params_needed_without_weight_decay():
    params = {"w": jnp.ones((3, 2), jnp.float32)}
    opts: list[eqxopt.AbstractOptimizer] = [
        eqxopt.Novograd(1e-2),
        eqxopt.Lion(1e-3, weight_decay=0.0),
    ]
    for opt in opts:
        updates, _ = opt.update(params, opt.init(params))
        assert updates["w"].shape == (3, 2)


# --- update rules written from the papers, in NumPy -----------------------------------


def _run(opt, params, grads_list):
    state = opt.init(params)
    out = []
    step = eqx.filter_jit(lambda g, s, p: opt.update(g, s, p))
    for g in grads_list:
        u, state = step(g, state, params)
        params = eqx.apply_updates(params, u)
        out.append(params)
    return out


def _grads(shape, n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(n)]


def test_lion_matches_paper_algorithm():
    # Chen et al. (2023), Algorithm 2 (Lion), with decoupled weight decay.
    lr, b1, b2, wd = 1e-2, 0.85, 0.95, 0.1
    gs = _grads((4, 3), 6)
    x = np.random.default_rng(1).standard_normal((4, 3))
    ours = _run(eqxopt.Lion(lr, b1, b2, weight_decay=wd), jnp.asarray(x), gs)
    m = np.zeros_like(x)
    for g, got in zip(gs, ours):
        c = b1 * m + (1 - b1) * g
        x = x - lr * (np.sign(c) + wd * x)
        m = b2 * m + (1 - b2) * g
        np.testing.assert_allclose(np.asarray(got), x, rtol=1e-12)


def test_adafactor_factored_second_moment_matches_paper():
    # Shazeer & Stern (2018), Algorithm 4 (matrices) without clipping or momentum,
    # with beta2_t = 1 - t^-0.8 and absolute step size lr.
    lr, eps1 = 1e-2, 1e-30
    gs = _grads((5, 7), 5)
    x = np.random.default_rng(2).standard_normal((5, 7))
    opt = eqxopt.Adafactor(
        lr,
        min_dim_size_to_factor=2,
        multiply_by_parameter_scale=False,
        clipping_threshold=None,
        eps=eps1,
    )
    ours = _run(opt, jnp.asarray(x), gs)
    r, c = np.zeros(5), np.zeros(7)
    for t, (g, got) in enumerate(zip(gs, ours), start=1):
        beta2 = 1 - t**-0.8
        g2 = g**2 + eps1
        r = beta2 * r + (1 - beta2) * g2.mean(axis=1)  # row means (paper: sums / m)
        c = beta2 * c + (1 - beta2) * g2.mean(axis=0)
        v = np.outer(r, c) / r.mean()
        x = x - lr * g / np.sqrt(v)
        # (Not tighter: the decay 1 - t^-0.8 is computed in float32, as Optax does.)
        np.testing.assert_allclose(np.asarray(got), x, rtol=1e-7)


def test_amsgrad_without_bias_correction_matches_paper():
    # Reddi et al. (2018), Algorithm 2 (AMSGrad), with eps added to the root.
    lr, b1, b2, eps = 1e-2, 0.8, 0.95, 1e-8
    gs = _grads((6,), 6)
    x = np.random.default_rng(3).standard_normal(6)
    opt = eqxopt.AMSGrad(
        lr, b1, b2, eps, bias_correction_mu=False, bias_correction_nu=False
    )
    ours = _run(opt, jnp.asarray(x), gs)
    m, v, v_max = np.zeros(6), np.zeros(6), np.zeros(6)
    for g, got in zip(gs, ours):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        v_max = np.maximum(v_max, v)
        x = x - lr * m / (np.sqrt(v_max) + eps)
        np.testing.assert_allclose(np.asarray(got), x, rtol=1e-12)


def test_novograd_matches_paper():
    # Ginsburg et al. (2019), Algorithm 1, per layer (= per param leaf).
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.5, 1e-8, 0.01
    gs = _grads((3, 4), 5)
    x = np.random.default_rng(4).standard_normal((3, 4))
    opt = eqxopt.Novograd(lr, b1, b2, eps, weight_decay=wd)
    ours = _run(opt, jnp.asarray(x), gs)
    m, v = np.zeros_like(x), 0.0
    for t, (g, got) in enumerate(zip(gs, ours), start=1):
        n2 = np.sum(g**2)
        v = n2 if t == 1 else b2 * v + (1 - b2) * n2
        m = b1 * m + (g / (np.sqrt(v) + eps) + wd * x)
        x = x - lr * m
        np.testing.assert_allclose(np.asarray(got), x, rtol=1e-12)


def test_radam_matches_paper_after_warmup():
    # Liu et al. (2020), Algorithm 2, with the tractability threshold 4 (the paper's;
    # Optax's default is 5) and eps outside the root.
    lr, b1, b2, eps = 1e-2, 0.9, 0.9, 1e-8
    gs = _grads((5,), 10)
    x = np.random.default_rng(5).standard_normal(5)
    ours = _run(eqxopt.RAdam(lr, b1, b2, eps, threshold=4.0), jnp.asarray(x), gs)
    m, v = np.zeros(5), np.zeros(5)
    rho_inf = 2 / (1 - b2) - 1
    for t, (g, got) in enumerate(zip(gs, ours), start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        m_hat = m / (1 - b1**t)
        rho = rho_inf - 2 * t * b2**t / (1 - b2**t)
        if rho >= 4:
            r = np.sqrt(
                (rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho)
            )
            x = x - lr * r * m_hat / (np.sqrt(v / (1 - b2**t)) + eps)
        else:
            x = x - lr * m_hat
        np.testing.assert_allclose(np.asarray(got), x, rtol=1e-12)


# --- Lion's fused step -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_lion_step_is_update_then_apply(dtype):
    model = {
        "w": make_params(dtype)["linear"]["weight"],
        "b": jnp.ones(5, dtype),
        "n": 3,
    }
    grads = {"w": jnp.full((5, 3), 0.3, dtype), "b": -jnp.ones(5, dtype), "n": None}
    opt = eqxopt.Lion(1e-2, weight_decay=0.1, mask={"w": True, "b": False, "n": False})
    state = opt.init(model)

    def update_then_apply(model, grads, state):
        updates, state = opt.update(grads, state, model)
        return eqx.apply_updates(model, updates), state

    for _ in range(3):
        stepped = eqx.filter_jit(opt.step)(model, grads, state)
        expected = eqx.filter_jit(update_then_apply)(model, grads, state)
        assert eqx.tree_equal(stepped, expected, typematch=True)
        model, state = stepped


def test_lion_donated_step_updates_momentum_in_place():
    """Optax's Lion (and Lion's `update` + `apply_updates`) read the old momentum in
    two XLA:CPU kernels, so a donated momentum is copied first; `Lion.step` is not."""
    params = {"w": jnp.ones((64, 32), jnp.float32), "b": jnp.ones((64,), jnp.float32)}
    grads = jtu.tree_map(lambda x: 0.1 * x, params)
    opt = eqxopt.Lion(1e-3)
    step = jax.jit(opt.step, donate_argnums=(0, 2))
    hlo = step.lower(params, grads, opt.init(params)).compile().as_text()
    assert hlo is not None
    copies = [line for line in hlo.splitlines() if " copy(" in line]
    assert not any("f32[64,32]" in line or "f32[64]" in line for line in copies), copies
