"""The Adam family beyond Optax parity: AMSGrad, Novograd and RAdam from the papers,
MARS against its authors' code, complex entries."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import eqxopt

from .helpers import make_params, random_like


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


def _mars_reference(
    params, grads_seq, lr, b1, b2, gamma, eps, wd, optimize_1d, lr_1d, betas_1d, wd_1d
):
    """`update_fn` of the reference, `mars_type="mars-adamw"`, `amsgrad=False`,
    `is_approx=True`, transcribed to NumPy (float64), one call per leaf and step."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    last = {k: np.zeros_like(x) for k, x in p.items()}
    out = []
    for step, grads in enumerate(grads_seq, start=1):
        for k in p:
            grad = np.asarray(grads[k], np.float64)
            if optimize_1d or grad.ndim == 2:
                c_t = (grad - last[k]) * (gamma * (b1 / (1.0 - b1))) + grad
                c_t_norm = np.linalg.norm(c_t)
                if c_t_norm > 1.0:
                    c_t = c_t / c_t_norm
                m[k] = m[k] * b1 + c_t * (1.0 - b1)
                v[k] = v[k] * b2 + c_t * c_t * (1.0 - b2)
                bc1, bc2 = 1.0 - b1**step, 1.0 - b2**step
                denom = (np.sqrt(v[k]) * (1 / np.sqrt(bc2)) + eps) * bc1
                p[k] = p[k] + -lr * (p[k] * wd + m[k] / denom)
            else:
                beta1_1d, beta2_1d = betas_1d
                m[k] = m[k] * beta1_1d + grad * (1.0 - beta1_1d)
                v[k] = v[k] * beta2_1d + grad * grad * (1.0 - beta2_1d)
                bc1, bc2 = 1.0 - beta1_1d**step, 1.0 - beta2_1d**step
                denom = (np.sqrt(v[k]) * (1 / np.sqrt(bc2)) + eps) * bc1
                # lr * lr_1d_factor = lr_1d for a constant learning rate
                p[k] = p[k] + -lr_1d * (p[k] * wd_1d + m[k] / denom)
            last[k] = grad
        out.append({k: x.copy() for k, x in p.items()})
    return out


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


def test_clip_and_adopt_bound_the_modulus_of_complex_entries():
    with jax.numpy_dtype_promotion("standard"):
        # Optax's clip raises on complex numbers (they have no order); ours clips the
        # modulus and keeps the phase, which is jnp.clip on real entries.
        z = jnp.array([3 + 4j, 0.3 - 0.4j, -2.0 + 0j], jnp.complex64)
        updates, _ = eqxopt.Clip(1.0).update({"z": z}, eqxopt.EmptyState())
        assert jnp.allclose(
            updates["z"], jnp.array([0.6 + 0.8j, 0.3 - 0.4j, -1.0 + 0j])
        )
        # ADOPT's first real step (step 1) clips g / sqrt(v_0) to 1 ** 0.25 = 1.
        opt = eqxopt.ADOPT(1.0, b1=0.0)
        params = {"z": jnp.zeros(3, jnp.complex64)}
        state = opt.init(params)
        _, state = opt.update({"z": jnp.ones(3, jnp.complex64)}, state, params)
        updates, _ = opt.update({"z": z}, state, params)
        assert jnp.allclose(jnp.abs(updates["z"]), jnp.array([1.0, 0.5, 1.0]))
        u = updates["z"]
        assert jnp.allclose(-u / jnp.abs(u), z / jnp.abs(z))  # the phase of g


@pytest.mark.parametrize("optimize_1d", [False, True])
def test_mars_matches_reference(optimize_1d):
    params = {"w": (5, 3), "b": (5,), "k": (2, 3, 4)}
    params = make_params(jnp.float64, params)
    keys = jr.split(jr.key(3), 6)
    # Large grads on some steps, so that the norm clipping of c_t is exercised.
    grads_seq = [
        jax.tree.map(lambda g: g * (0.1 if i % 2 else 2.0), random_like(k, params))
        for i, k in enumerate(keys)
    ]
    lr, b1, b2, gamma, eps, wd = 3e-2, 0.95, 0.99, 0.025, 1e-8, 0.1
    lr_1d, betas_1d, wd_1d = 1e-2, (0.9, 0.95), 0.05
    expected = _mars_reference(
        params,
        grads_seq,
        lr,
        b1,
        b2,
        gamma,
        eps,
        wd,
        optimize_1d,
        lr_1d,
        betas_1d,
        wd_1d,
    )
    opt = eqxopt.MARS(
        lr,
        b1,
        b2,
        gamma,
        eps,
        weight_decay=wd,
        optimize_1d=optimize_1d,
        lr_1d=lr_1d,
        b1_1d=betas_1d[0],
        b2_1d=betas_1d[1],
        weight_decay_1d=wd_1d,
    )
    state = opt.init(params)
    step = eqx.filter_jit(opt.step)
    for i, grads in enumerate(grads_seq):
        params, state = step(params, grads, state)
        for k in params:
            np.testing.assert_allclose(
                params[k], expected[i][k], rtol=1e-12, atol=1e-14, err_msg=f"{i} {k}"
            )
    # The defaults are the reference's.
    default = eqxopt.MARS(1e-3)
    assert (default.b1, default.b2, default.gamma, default.eps) == (
        0.95,
        0.99,
        0.025,
        1e-8,
    )
    assert (default.lr_1d, default.b1_1d, default.b2_1d, default.weight_decay_1d) == (
        3e-3,
        0.9,
        0.95,
        0.1,
    )
