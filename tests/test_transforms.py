"""Building blocks beyond Optax parity: ReduceOnPlateau on negative losses, AGC in
Equinox's layout, KeepParamsNonnegative in low precision."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import eqxopt


def _plateau_scales(tx, values):
    """The scale after each value, for an eqxopt optimizer or an Optax transform."""
    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.ones(3)}
    state = tx.init(params)
    scales = []
    for v in values:
        with jax.numpy_dtype_promotion("standard"):  # Optax is not strict-clean
            _, state = tx.update(grads, state, params, value=jnp.asarray(v))
        scales.append(float(state.scale))
    return scales


def test_reduce_on_plateau_detects_a_plateau_of_negative_losses():
    """A loss stuck at -10 is a plateau: after `patience` values the scale drops.
    Optax's test `v < (1 - rtol) * best` puts the threshold at -9.999, above the best,
    so it counts every repeat of -10 as an improvement and never reduces."""
    values = [-10.0] * 7
    ours = _plateau_scales(eqxopt.ReduceOnPlateau(factor=0.5, patience=2), values)
    theirs = _plateau_scales(optax.contrib.reduce_on_plateau(0.5, 2), values)
    assert ours == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.125]
    assert theirs == [1.0] * 7


def test_reduce_on_plateau_negative_losses_relative_tolerance():
    """Around -10, with rtol=1e-3 an improvement must beat the best by 0.01: -10.005
    is not one (plateau), -10.02 is (the count restarts)."""
    opt = eqxopt.ReduceOnPlateau(factor=0.5, patience=2, rtol=1e-3)
    assert _plateau_scales(opt, [-10.0, -10.005, -10.02, -10.025, -10.026]) == [
        1.0,
        1.0,
        1.0,
        1.0,
        0.5,
    ]
    # Steady real progress on negative losses never reduces the scale.
    assert _plateau_scales(opt, [-1.0, -2.0, -3.0, -4.0, -5.0]) == [1.0] * 5


def test_reduce_on_plateau_matches_optax_on_positive_losses():
    values = [5.0, 4.0, 4.0, 3.9999, 4.1, 2.0, 2.0, 2.0, 2.0, 1.9, 1.9]
    kwargs = dict(factor=0.3, patience=1, rtol=1e-3, cooldown=1, min_scale=0.05)
    ours = _plateau_scales(eqxopt.ReduceOnPlateau(**kwargs), values)
    theirs = _plateau_scales(optax.contrib.reduce_on_plateau(**kwargs), values)
    assert ours == theirs
    assert min(ours) < 1  # the scale was reduced along the way


def test_reduce_on_plateau_scale_in_hyperparams_and_updates():
    opt = eqxopt.Chain(eqxopt.SGD(1.0), eqxopt.ReduceOnPlateau(factor=0.5, patience=1))
    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.ones(3)}
    state = opt.init(params)
    step = eqx.filter_jit(lambda g, s, p, v: opt.update(g, s, p, value=v))
    updates = None
    for _ in range(2):
        updates, state = step(grads, state, params, jnp.asarray(1.0))
    assert updates is not None and opt.hyperparams(state)[1]["scale"] == 0.5
    assert jnp.array_equal(updates["w"], jnp.full(3, -0.5))


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


def test_keep_params_nonnegative_in_low_precision():
    x = {"w": jnp.asarray([1e-3, 0.5, 2.0, 0.0], jnp.bfloat16)}
    opt = eqxopt.Chain(eqxopt.SGD(1.0), eqxopt.KeepParamsNonnegative())
    state = opt.init(x)
    g = {"w": jnp.asarray([1.0009e-3, 0.7, -1.0, 3.0], jnp.float32)}
    x, state = opt.step(x, g, state)
    assert bool(jnp.all(x["w"] >= 0))
    assert float(x["w"][2]) == 3.0
