"""The diagonal adaptive methods (RMSProp, Adagrad, Adadelta, Adafactor, SM3, MADGRAD,
Sophia) beyond Optax parity: their state layout and their rules written from the
papers, in NumPy."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import optax

import eqxopt

from .helpers import make_params
from .registry.adaptive import FACTOR_SHAPES


def _is_none(x):
    return x is None


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


def test_hutchinson_legacy_raw_key_gives_the_same_probes():
    """Optax's default probe key is the raw `PRNGKey(0)`; the typed `key(0)` (our
    default) has the same bits, and so has a raw key passed to us."""

    def loss(p):
        return jnp.sum(jnp.sin(p["w"]) * p["w"] ** 2)

    params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)}
    ref = optax.contrib.hutchinson_estimator_diag_hessian()
    theirs = ref.update(params, ref.init(params), params, obj_fn=loss)[0]
    for seed in (None, 0, jr.key(0), jr.PRNGKey(0)):
        opt = eqxopt.HutchinsonEstimatorDiagHessian(seed)
        ours = opt.update(params, opt.init(params), params, obj_fn=loss)[0]
        assert eqx.tree_equal(ours, theirs), seed


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
