"""SGD and its relatives beyond Optax parity: Lion's rule from the paper and its
in-place step, noise statistics (NoisySGD, DP-SGD), Rprop's rule from the paper."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import optax
import pytest

import eqxopt

from .helpers import make_params


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


def _per_example(params, n=3):
    return jax.tree.map(lambda p: jnp.stack([p * (i + 1) for i in range(n)]), params)


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


def test_dp_noise_on_complex_entries_has_the_full_std_in_each_part():
    with jax.numpy_dtype_promotion("standard"):
        opt = eqxopt.DifferentiallyPrivateAggregate(1.0, 1.0, key=0)
        params = {"w": jnp.zeros(20_000, jnp.complex64)}
        grads = {
            "w": jnp.zeros((1, 20_000), jnp.complex64)
        }  # batch of 1: std = C sigma
        updates, _ = opt.update(grads, opt.init(params), params)
        assert 0.98 < jnp.std(updates["w"].real) < 1.02
        assert 0.98 < jnp.std(updates["w"].imag) < 1.02


def test_dpsgd_seed_reproduces_optax_and_differs_between_seeds():
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    grads = _per_example(params)

    def ours(seed):
        opt = eqxopt.DPSGD(0.1, 1.0, 1.5, seed)
        return opt.update(grads, opt.init(params), params)[0]

    ref = optax.contrib.dpsgd(0.1, 1.0, 1.5, 11)
    with jax.numpy_dtype_promotion("standard"):
        theirs = ref.update(grads, ref.init(params), params)[0]
    assert eqx.tree_equal(ours(11), theirs)
    assert eqx.tree_equal(ours(11), ours(11))
    assert not eqx.tree_equal(ours(11), ours(12))


def test_dp_aggregate_needs_a_batch_axis():
    opt = eqxopt.DifferentiallyPrivateAggregate(1.0, 1.0)
    grads = {"a": jnp.ones(()), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match="batch axis"):
        opt.update(grads, opt.init(grads))


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
    np.testing.assert_allclose(np.asarray(again["x"]), draws[0], rtol=1e-6)
    other_opt = eqxopt.NoisySGD(1.0, eta, gamma, key=12)
    other, _ = other_opt.update(zeros, other_opt.init(params), params)
    assert not np.allclose(np.asarray(other["x"]), draws[0])


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
