"""What the registry (tests/registry/contrib_b.py) cannot express: missing extra
arguments, ReduceOnPlateau on negative losses, seed reproduction, and MARS / Cautious
against NumPy transcriptions of the authors' reference code."""

import inspect

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import optax
import pytest

import eqxopt
from eqxopt._core.base import describe

from .helpers import make_params, random_like


def _loss(params):
    return sum(jnp.sum(p**2 + 0.1 * p**4) for p in jtu.tree_leaves(params))


# --- extra arguments: missing -> an error naming the argument, at trace time ---------


@pytest.mark.parametrize(
    "opt, name",
    [
        (eqxopt.ReduceOnPlateau(), "value"),
        (eqxopt.Chain(eqxopt.Adam(1e-3), eqxopt.ReduceOnPlateau()), "value"),
        (eqxopt.SAM(eqxopt.SGD(0.1), eqxopt.SGD(0.1), opaque_mode=True), "grad_fn"),
        (eqxopt.Sophia(1e-3), "obj_fn"),
        (eqxopt.HutchinsonEstimatorDiagHessian(), "obj_fn"),
    ],
    ids=["plateau", "chain_plateau", "sam_opaque", "sophia", "hutchinson"],
)
def test_missing_extra_argument_is_named_at_trace_time(opt, name):
    params = make_params()
    state = opt.init(params)
    step = eqx.filter_jit(lambda g, s, p: opt.update(g, s, p))
    with pytest.raises(ValueError, match=f"`{name}=`"):
        step(params, state, params)


def test_transparent_sam_needs_no_extra_argument():
    opt = eqxopt.SAM(eqxopt.SGD(0.1), eqxopt.SGD(0.1))
    params = make_params()
    updates, _ = opt.update(params, opt.init(params), params)
    assert jtu.tree_structure(updates) == jtu.tree_structure(params)


# --- SAM: the unused optimizer's step -------------------------------------------------

# The adversarial optimizers of two SAMs: stateless (the paper's: SAM computes both
# steps and selects one) and with a momentum buffer (SAM runs only the step it needs,
# in a `lax.cond`).
_SAM_ADV = {
    "stateless": lambda: eqxopt.Chain(eqxopt.Normalize(), eqxopt.SGD(0.05)),
    "momentum": lambda: eqxopt.Chain(
        eqxopt.Normalize(), eqxopt.SGD(0.05, momentum=0.5)
    ),
}


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


# --- ReduceOnPlateau ------------------------------------------------------------------


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
    for _ in range(2):
        updates, state = step(grads, state, params, jnp.asarray(1.0))
    assert opt.hyperparams(state)[1]["scale"] == 0.5
    assert jnp.array_equal(updates["w"], jnp.full(3, -0.5))


# --- randomness: typed keys, seeded as Optax seeds them ------------------------------


def _per_example(params, n=3):
    return jax.tree.map(lambda p: jnp.stack([p * (i + 1) for i in range(n)]), params)


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


def test_key_states_hold_a_typed_key():
    params = {"w": jnp.ones((2, 3))}
    states = [
        eqxopt.DifferentiallyPrivateAggregate(1.0, 1.0, key=3).init(params),
        eqxopt.DPSGD(0.1, 1.0, 1.0, 3).init(params).aggregate_state,
        eqxopt.Sophia(0.1).init(params).hessian_fn_state,
    ]
    for state in states:
        assert jnp.issubdtype(state.key.dtype, jax.dtypes.prng_key)
        assert describe(state.key) == "key<fry>[]"
        assert describe(state.key_data) == "int32[2]"


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


def test_dp_aggregate_needs_a_batch_axis():
    opt = eqxopt.DifferentiallyPrivateAggregate(1.0, 1.0)
    grads = {"a": jnp.ones(()), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match="batch axis"):
        opt.update(grads, opt.init(grads))


@pytest.mark.parametrize(
    "cls, fn",
    [
        (eqxopt.DPSGD, optax.contrib.dpsgd),
        (
            eqxopt.DifferentiallyPrivateAggregate,
            optax.contrib.differentially_private_aggregate,
        ),
        (eqxopt.SAM, optax.contrib.sam),
        (eqxopt.Sophia, optax.contrib.sophia),
        (eqxopt.ReduceOnPlateau, optax.contrib.reduce_on_plateau),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_positional_order_follows_optax(cls, fn):
    ours = [n for n in inspect.signature(cls).parameters]
    theirs = [
        "state_dtype" if n == "mu_dtype" else n
        for n, p in inspect.signature(fn).parameters.items()
        if p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    assert ours[: len(theirs)] == theirs


# --- MARS against the reference (AGI-Arena/MARS, MARS/optimizers/mars.py) ---------


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


# --- Cautious against the reference (kyleliang919/C-Optim, c_adamw.py) -------------


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


@pytest.mark.parametrize(
    "sample", [jr.normal, jr.rademacher], ids=["normal", "rademacher"]
)
def test_per_leaf_draws_are_one_call_per_leaf(sample):
    """The per-leaf noise of Kron, AddNoise, DifferentiallyPrivateAggregate and
    Sophia's Hutchinson probes comes from `draws_per_leaf`: same-shape leaves share
    one `vmap`-ed sampler, and every leaf gets what its own key draws alone."""
    from eqxopt._misc import draws_per_leaf

    specs = [((4, 3), jnp.float32), ((5,), jnp.float64), ((4, 3), jnp.float32)]
    specs += [((4, 3), jnp.float64), ((5,), jnp.float64), ((), jnp.float32)]
    keys = jr.split(jr.key(3), len(specs))
    want = [sample(k, shape, dtype) for k, (shape, dtype) in zip(keys, specs)]
    for got in (
        draws_per_leaf(sample, keys, specs),
        jax.jit(lambda keys: draws_per_leaf(sample, keys, specs))(keys),
    ):
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
