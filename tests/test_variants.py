"""Variants beyond the adaptive family (`tests/registry/variants.py`), beyond what the
registry gives every entry: the paper rules where Optax has no implementation (SM3
without momentum, Adadelta's `learning_rate=None`, AGC in Equinox's layout), gradient
noise statistics and determinism, Lookahead and ParamsEMA behaviour."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import eqxopt


def test_adadelta_without_learning_rate_is_the_paper_rule():
    rng = np.random.default_rng(0)
    rho, eps = 0.9, 1e-6
    p = rng.normal(size=(4, 3))
    opt = eqxopt.Adadelta(rho=rho, eps=eps)
    state = opt.init(jnp.asarray(p))
    params = jnp.asarray(p)
    e_g, e_x = np.zeros_like(p), np.zeros_like(p)
    for _ in range(5):
        g = rng.normal(size=p.shape)
        e_g = rho * e_g + (1 - rho) * g**2
        dx = -np.sqrt(e_x + eps) / np.sqrt(e_g + eps) * g
        e_x = rho * e_x + (1 - rho) * dx**2
        p = p + dx
        params, state = opt.step(params, jnp.asarray(g), state)
    np.testing.assert_allclose(np.asarray(params), p, rtol=1e-10)


def _sm3_numpy(leaves_and_grads, lr, eps, steps):
    """SM3-II (Anil et al. 2019, Alg. 2) with a cover of one set per index of each
    axis, no momentum; rank <= 1 leaves keep one accumulator per entry."""
    out = []
    for p, grads in leaves_and_grads:
        p = p.copy()
        mus = [np.zeros(p.shape)] if p.ndim <= 1 else [np.zeros(n) for n in p.shape]
        for g in grads[:steps]:
            if p.ndim <= 1:
                nu = mus[0] + g**2
                mus = [nu]
            else:
                prev = np.full(p.shape, np.inf)
                for r, mu in enumerate(mus):
                    shape = [1] * p.ndim
                    shape[r] = p.shape[r]
                    prev = np.minimum(prev, mu.reshape(shape))
                nu = prev + g**2
                mus = [
                    nu.max(axis=tuple(j for j in range(p.ndim) if j != r))
                    for r in range(p.ndim)
                ]
            step = np.where(nu > 0, g / np.sqrt(nu + eps), 0.0)
            p = p - lr * step
        out.append(p)
    return out


def test_sm3_without_momentum_matches_paper_rule():
    rng = np.random.default_rng(1)
    shapes = {"m": (4, 3), "t": (2, 3, 2), "v": (5,), "s": ()}
    params = {k: rng.normal(size=s) for k, s in shapes.items()}
    grads = {k: [rng.normal(size=s) for _ in range(4)] for k, s in shapes.items()}
    opt = eqxopt.SM3(0.1, momentum=None)
    x = jax.tree.map(jnp.asarray, params)
    state = opt.init(x)
    assert state.nu is None
    assert [a.shape for a in state.mu["t"]] == [(2,), (3,), (2,)]
    for i in range(4):
        g = {k: jnp.asarray(v[i]) for k, v in grads.items()}
        x, state = opt.step(x, g, state)
    keys = list(shapes)
    expected = _sm3_numpy([(params[k], grads[k]) for k in keys], 0.1, 1e-8, 4)
    for k, e in zip(keys, expected):
        np.testing.assert_allclose(np.asarray(x[k]), e, rtol=1e-10, err_msg=k)


def test_agc_default_clips_per_output_unit_in_equinox_layout():
    rng = np.random.default_rng(2)
    shapes = {"w": (5, 3), "k": (4, 2, 3, 3), "b": (5,), "s": ()}
    p = {k: rng.normal(size=s) for k, s in shapes.items()}
    g = {k: 3 * rng.normal(size=s) for k, s in shapes.items()}
    clipping, eps = 0.2, 1e-3
    opt = eqxopt.AdaptiveGradClip(clipping, eps=eps)
    updates, _ = opt.update(
        jax.tree.map(jnp.asarray, g), opt.init(p), jax.tree.map(jnp.asarray, p)
    )
    for k in shapes:
        axes = tuple(range(1, g[k].ndim)) if g[k].ndim > 1 else None
        g_norm = np.sqrt(np.sum(g[k] ** 2, axis=axes, keepdims=True))
        p_norm = np.sqrt(np.sum(p[k] ** 2, axis=axes, keepdims=True))
        max_norm = clipping * np.maximum(p_norm, eps)
        expected = np.where(g_norm < max_norm, g[k], g[k] * max_norm / g_norm)
        np.testing.assert_allclose(np.asarray(updates[k]), expected, rtol=1e-10)
    # One row of the Linear weight is one unit: its clipped norm is clipping * |row|.
    rows = np.linalg.norm(np.asarray(updates["w"]), axis=1)
    np.testing.assert_allclose(rows, clipping * np.linalg.norm(p["w"], axis=1))


def test_noisy_sgd_noise_statistics_and_determinism():
    n = 40_000
    params = {"x": jnp.zeros((n,), jnp.float32)}
    zeros = {"x": jnp.zeros((n,), jnp.float32)}
    eta, gamma = 0.5, 0.55
    opt = eqxopt.NoisySGD(1.0, eta=eta, gamma=gamma, key=11)
    step = eqx.filter_jit(opt.update)
    state = opt.init(params)
    assert jnp.issubdtype(state.key.dtype, jax.dtypes.prng_key)
    draws = []
    for k in range(3):
        u, state = step(zeros, state, params)
        draws.append(np.asarray(u["x"]))
        expected_std = np.sqrt(eta / (k + 1) ** gamma)
        assert abs(np.std(draws[-1]) / expected_std - 1) < 0.03
        assert abs(np.mean(draws[-1])) < 4 * expected_std / np.sqrt(n)
    assert not np.allclose(draws[0] / draws[0].std(), draws[1] / draws[1].std())
    # Same seed (as an int or a typed key) -> the same noise; another seed -> other.
    again, _ = eqxopt.NoisySGD(1.0, eta, gamma, key=jr.key(11)).update(
        zeros, opt.init(params), params
    )
    # (not bit-identical only because `draws` came from a jitted step)
    np.testing.assert_allclose(np.asarray(again["x"]), draws[0], rtol=1e-6)
    other, _ = eqxopt.NoisySGD(1.0, eta, gamma, key=12).update(
        zeros, opt.init(params), params
    )
    assert not np.array_equal(np.asarray(other["x"]), draws[0])


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


def test_keep_params_nonnegative_in_low_precision():
    x = {"w": jnp.asarray([1e-3, 0.5, 2.0, 0.0], jnp.bfloat16)}
    opt = eqxopt.Chain(eqxopt.SGD(1.0), eqxopt.KeepParamsNonnegative())
    state = opt.init(x)
    g = {"w": jnp.asarray([1.0009e-3, 0.7, -1.0, 3.0], jnp.float32)}
    x, state = opt.step(x, g, state)
    assert bool(jnp.all(x["w"] >= 0))
    assert float(x["w"][2]) == 3.0


def test_polyak_needs_value_and_prodigy_survives_zero_grads():
    x = {"w": jnp.ones((3,), jnp.float32)}
    opt = eqxopt.PolyakSGD()
    with pytest.raises(ValueError, match="value=loss"):
        opt.update(x, opt.init(x), x)
    prodigy = eqxopt.Prodigy()
    state = prodigy.init(x)
    zeros = {"w": jnp.zeros((3,), jnp.float32)}
    for _ in range(2):
        x, state = prodigy.step(x, zeros, state)
    assert float(state.estim_lr) == pytest.approx(1e-6)
    assert bool(jnp.all(jnp.isfinite(x["w"])))


def test_rprop_is_the_paper_rule_without_optax_one_step_delay():
    # torch.optim.Rprop's numbers (optax 0.2.8 gives 0, 0.1, 0.12, 0, 0: stale by one).
    opt = eqxopt.Rprop(0.1, eta_minus=0.5, eta_plus=1.2)
    x = jnp.zeros((1,), jnp.float64)
    state = opt.init(x)
    steps = []
    for g in [1.0, 1.0, 1.0, -1.0, 1.0]:
        u, state = opt.update(jnp.asarray([g]), state, x)
        steps.append(-float(u[0]))
    np.testing.assert_allclose(steps, [0.1, 0.12, 0.144, 0.0, 0.072], rtol=1e-12)
    # iRprop- on random signs, written plainly.
    rng = np.random.default_rng(5)
    lr, em, ep, lo, hi = 0.02, 0.4, 1.5, 1e-3, 0.05
    opt = eqxopt.Rprop(
        lr, eta_minus=em, eta_plus=ep, min_step_size=lo, max_step_size=hi
    )
    p = rng.normal(size=(7,))
    x = jnp.asarray(p)
    state = opt.init(x)
    step, prev = np.full(p.shape, lr), np.zeros(p.shape)
    for _ in range(8):
        g = rng.normal(size=p.shape)
        s = g * prev
        step = np.where(s > 0, np.clip(step * ep, lo, hi), step)
        step = np.where(s < 0, np.clip(step * em, lo, hi), step)
        prev = np.where(s < 0, 0.0, step * np.sign(g))
        p = p - prev
        x, state = opt.step(x, jnp.asarray(g), state)
    np.testing.assert_allclose(np.asarray(x), p, rtol=1e-12)
