"""Diagonal adaptive methods without Adam's moments (RMSProp, Adagrad, Adadelta,
Adafactor, SM3, MADGRAD, Sophia), each against its Optax counterpart."""

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import optax

import eqxopt

from ..helpers import Case, is_matrix, ndim2_mask


# Adafactor with `min_dim_size_to_factor=4`: "w" and "m3" are factored (over their two
# largest axes, which for "m3" are not the last two), "thin" is 2-D but not factored
# (its second-largest axis is 3 < 4), "b" and "s" are unfactored.
FACTOR_SHAPES = {
    "w": (6, 4),
    "m3": (5, 3, 4),
    "thin": (3, 8),
    "b": (5,),
    "s": (),
}


# Optax's default `min_dim_size_to_factor=128`: one factored, one unfactored leaf.
LARGE_SHAPES = {"big": (130, 128), "b": (130,)}


def _relative_step(count):
    """Adafactor's relative step size $\\min(10^{-2}, 1/\\sqrt{k})$, $k$ from 1."""
    return jnp.minimum(1e-2, jax.lax.rsqrt(count.astype(jnp.float32) + 1))


def _capped_decay(step, decay_rate):
    """A second-moment decay capped at 0.9 (Zhai et al., 2021), in float32 as Optax."""
    t = jnp.asarray(step, jnp.float32) + 1
    return jnp.minimum(0.9, 1 - t ** -jnp.asarray(decay_rate, jnp.float32))


# Optax's MADGRAD computes lr * sqrt(k + 1) from its int32 count in float32, also for
# float64 params (`jnp.sqrt` of an int32 is float32): float64 parity is limited to
# float32's precision in that factor (measured: 4e-8 relative in the params).
MADGRAD_RTOL64 = 1e-6


def _own_buffers(tx):
    """`tx` with an `init` that copies its state: Optax's COCOB, DoG, DoWG, MADGRAD and
    Mechanic keep the params themselves in their state, so (params, state) could not
    be donated together to a jitted step (as the update benchmark does). The numbers
    are unchanged."""

    def init(params):
        return jax.tree.map(jnp.copy, tx.init(params))

    return optax.GradientTransformationExtraArgs(init, tx.update)


def _loss(params):
    """1 + sum(p^2 / 2 + p^4 / 4): a positive loss whose Hessian is not constant (so
    Hutchinson's estimate depends on the params), computed in at least float32."""
    leaves = jtu.tree_leaves(params)
    dtype = jnp.float64 if leaves[0].dtype == jnp.float64 else jnp.float32
    total = jnp.asarray(1.0, dtype)
    for p in leaves:
        q = p.astype(dtype)
        total = total + jnp.sum(q * q / 2 + q**4 / 4)
    return total


def _obj_fn(params):
    return {"obj_fn": jtu.Partial(_loss)}


# Optax evaluates its schedules in float32 even under x64 (eqxopt's follow the
# params' precision), so float64 parity of scheduled cases is limited to ~1e-7 in the
# learning rate, which scale-invariant steps (Fromage, Prodigy) amplify to ~1e-5.
SCHEDULE_RTOL64_AMPLIFIED = 1e-5


# Shapes without a rank-0 leaf, for Optax transforms that cannot take one (SM3, and
# AGC with an explicit `axis`).
NO_SCALAR = {"w": (5, 3), "b": (5,), "k": (2, 3, 4)}


CASES = [
    # --- RMSProp ----------------------------------------------------------------------
    Case(
        "rmsprop",
        lambda: eqxopt.RMSProp(
            eqxopt.schedules.CosineDecay(3e-3, 6, 0.2),
            decay=0.8,
            eps=1e-6,
            initial_scale=0.1,
        ),
        lambda: optax.rmsprop(
            optax.cosine_decay_schedule(3e-3, 6, 0.2),
            decay=0.8,
            eps=1e-6,
            initial_scale=0.1,
        ),
        bad=(
            (lambda: eqxopt.RMSProp(-1e-3), "learning_rate"),
            (lambda: eqxopt.RMSProp(1e-3, decay=1.0), "decay"),
            (lambda: eqxopt.RMSProp(1e-3, eps=-1e-8), "eps"),
            (lambda: eqxopt.RMSProp(1e-3, initial_scale=-0.1), "initial_scale"),
            (lambda: eqxopt.RMSProp(1e-3, momentum=1.0), "momentum"),
        ),
    ),
    Case(
        # (Not with `bias_correction`: centered and bias-corrected, the first step's
        # variance is 0 up to rounding, so it is ill-posed in both implementations.)
        "rmsprop_centered_nesterov",
        lambda: eqxopt.RMSProp(
            2e-3,
            decay=0.85,
            eps=1e-5,
            eps_in_sqrt=False,
            centered=True,
            momentum=0.8,
            nesterov=True,
        ),
        lambda: optax.rmsprop(
            2e-3,
            decay=0.85,
            eps=1e-5,
            eps_in_sqrt=False,
            centered=True,
            momentum=0.8,
            nesterov=True,
        ),
    ),
    Case(
        "chain_scale_by_rms",
        lambda: eqxopt.Chain(
            eqxopt.ScaleByRms(0.8, 1e-6, eps_in_sqrt=False, bias_correction=True),
            eqxopt.ScaleByLearningRate(1e-2),
        ),
        lambda: optax.chain(
            optax.scale_by_rms(0.8, 1e-6, eps_in_sqrt=False, bias_correction=True),
            optax.scale_by_learning_rate(1e-2),
        ),
        bad=((lambda: eqxopt.ScaleByRms(decay=-0.1), "decay"),),
    ),
    Case(
        "chain_scale_by_stddev",
        lambda: eqxopt.Chain(
            eqxopt.ScaleByStddev(0.85, 1e-5, initial_scale=0.2),
            eqxopt.Trace(0.7),
            eqxopt.Scale(-1e-2),
        ),
        lambda: optax.chain(
            optax.scale_by_stddev(0.85, 1e-5, initial_scale=0.2),
            optax.trace(0.7),
            optax.scale(-1e-2),
        ),
        bad=(
            (lambda: eqxopt.Trace(1.0), "decay"),
            (lambda: eqxopt.ScaleByStddev(eps=-1.0), "eps"),
        ),
    ),
    # --- Adagrad ----------------------------------------------------------------------
    Case(
        "adagrad",
        lambda: eqxopt.Adagrad(0.3, initial_accumulator_value=0.05, eps=1e-6),
        lambda: optax.adagrad(0.3, initial_accumulator_value=0.05, eps=1e-6),
        bad=(
            (lambda: eqxopt.Adagrad(-0.1), "learning_rate"),
            (
                lambda: eqxopt.Adagrad(0.1, initial_accumulator_value=-1.0),
                "initial_accumulator_value",
            ),
        ),
    ),
    Case(
        "chain_scale_by_rss",
        lambda: eqxopt.Chain(
            eqxopt.ScaleByRss(initial_accumulator_value=0.0, eps=1e-5),
            eqxopt.ScaleByLearningRate(0.2),
        ),
        lambda: optax.chain(
            optax.scale_by_rss(initial_accumulator_value=0.0, eps=1e-5),
            optax.scale_by_learning_rate(0.2),
        ),
        bad=((lambda: eqxopt.ScaleByRss(eps=-1e-7), "eps"),),
    ),
    # --- Adafactor --------------------------------------------------------------------
    Case(
        "adafactor",
        lambda: eqxopt.Adafactor(
            2e-2,
            min_dim_size_to_factor=4,
            decay_rate=0.7,
            clipping_threshold=0.5,
            momentum=0.8,
            weight_decay_rate=1e-2,
            eps=1e-20,
            weight_decay_mask=is_matrix,
        ),
        lambda: optax.adafactor(
            2e-2,
            min_dim_size_to_factor=4,
            decay_rate=0.7,
            clipping_threshold=0.5,
            momentum=0.8,
            # eqxopt keeps the momentum in the param's dtype. (Optax accepts None
            # though its annotation says `DTypeLike`.)
            dtype_momentum=None,  # pyright: ignore[reportArgumentType]
            weight_decay_rate=1e-2,
            eps=1e-20,
            weight_decay_mask=ndim2_mask,
        ),
        shapes=FACTOR_SHAPES,
        bad=(
            (lambda: eqxopt.Adafactor(-1e-2), "learning_rate"),
            (
                lambda: eqxopt.Adafactor(min_dim_size_to_factor=0),
                "min_dim_size_to_factor",
            ),
            (lambda: eqxopt.Adafactor(decay_rate=-0.8), "decay_rate"),
            (lambda: eqxopt.Adafactor(clipping_threshold=0.0), "clipping_threshold"),
            (lambda: eqxopt.Adafactor(momentum=1.0), "momentum"),
            (lambda: eqxopt.Adafactor(weight_decay_rate=-1.0), "weight_decay_rate"),
            (lambda: eqxopt.Adafactor(eps=-1e-30), "eps"),
        ),
    ),
    Case(
        "adafactor_relative_step",
        lambda: eqxopt.Adafactor(
            _relative_step,
            min_dim_size_to_factor=4,
            decay_rate=0.9,
            decay_offset=-3,
            clipping_threshold=2.0,
        ),
        lambda: optax.adafactor(
            _relative_step,
            min_dim_size_to_factor=4,
            decay_rate=0.9,
            decay_offset=-3,
            clipping_threshold=2.0,
        ),
        shapes=FACTOR_SHAPES,
    ),
    Case(
        "adafactor_unscaled_unclipped",
        lambda: eqxopt.Adafactor(
            None,
            decay_rate=0.6,
            multiply_by_parameter_scale=False,
            clipping_threshold=None,
            eps=1e-25,
        ),
        lambda: optax.adafactor(
            None,
            decay_rate=0.6,
            multiply_by_parameter_scale=False,
            clipping_threshold=None,
            eps=1e-25,
        ),
        # Optax's default `min_dim_size_to_factor=128`; without a learning rate every
        # step is O(1): after ten steps params near 10 are 1e-6 apart in float32, and
        # the factored row/column sums over 128 entries round differently in the last
        # bits with the code generation (the suite's differs from the default).
        shapes=LARGE_SHAPES,
        atol=1e-5,
    ),
    Case(
        "chain_scale_by_factored_rms",
        lambda: eqxopt.Chain(
            eqxopt.ScaleByFactoredRms(
                True, 0.6, -2, 4, 1e-20, decay_rate_fn=_capped_decay
            ),
            eqxopt.ScaleByLearningRate(1e-2),
        ),
        lambda: optax.chain(
            optax.scale_by_factored_rms(
                True, 0.6, -2, 4, 1e-20, decay_rate_fn=_capped_decay
            ),
            optax.scale_by_learning_rate(1e-2),
        ),
        shapes=FACTOR_SHAPES,
        bad=((lambda: eqxopt.ScaleByFactoredRms(epsilon=-1.0), "epsilon"),),
    ),
    # --- MADGRAD ---------------------------------------------------------------------
    Case(
        "madgrad",
        lambda: eqxopt.Madgrad(1e-2),
        lambda: _own_buffers(optax.contrib.madgrad(1e-2)),
        rtol64=MADGRAD_RTOL64,
        bad=(
            (lambda: eqxopt.Madgrad(-1e-2), "learning_rate"),
            (lambda: eqxopt.Madgrad(1e-2, momentum=1.0), "momentum"),
            (lambda: eqxopt.Madgrad(1e-2, weight_decay=-1.0), "weight_decay"),
            (lambda: eqxopt.Madgrad(1e-2, eps=-1.0), "eps"),
        ),
        optax_fn="contrib.madgrad",
    ),
    Case(
        "madgrad_schedule_decay",
        lambda: eqxopt.Madgrad(
            eqxopt.schedules.Linear(5e-2, 1e-2, 10),
            momentum=0.5,
            weight_decay=1e-2,
            eps=1e-5,
        ),
        lambda: _own_buffers(
            optax.contrib.madgrad(
                optax.linear_schedule(5e-2, 1e-2, 10),
                momentum=0.5,
                weight_decay=1e-2,
                eps=1e-5,
            )
        ),
        rtol64=max(SCHEDULE_RTOL64_AMPLIFIED, MADGRAD_RTOL64),
        optax_fn="contrib.madgrad",
    ),
    # --- Sophia (Hutchinson probes from the same seed as Optax's) ---------------------
    Case(
        "sophia",
        lambda: eqxopt.Sophia(
            0.05,
            weight_decay=1e-2,
            weight_decay_mask=lambda p: p.ndim > 1,
            update_interval=3,
            clip_threshold=0.5,
        ),
        lambda: optax.contrib.sophia(
            0.05,
            weight_decay=1e-2,
            weight_decay_mask=ndim2_mask,
            update_interval=3,
            clip_threshold=0.5,
        ),
        loss=_loss,
        extra=_obj_fn,
        optax_fn="contrib.sophia",
        bad=(
            (lambda: eqxopt.Sophia(-1.0), "learning_rate"),
            (lambda: eqxopt.Sophia(0.1, b1=1.0), "b1"),
            (lambda: eqxopt.Sophia(0.1, b2=-0.1), "b2"),
            (lambda: eqxopt.Sophia(0.1, eps=-1.0), "eps"),
            (lambda: eqxopt.Sophia(0.1, gamma=0.0), "gamma"),
            (lambda: eqxopt.Sophia(0.1, clip_threshold=-1.0), "clip_threshold"),
            (lambda: eqxopt.Sophia(0.1, update_interval=0), "update_interval"),
            (
                lambda: eqxopt.Sophia(0.1, hessian_diagonal_fn=optax.sgd(0.1)),  # pyright: ignore
                "hessian_diagonal_fn",
            ),
        ),
    ),
    Case(
        "sophia_seeded_no_clip",
        lambda: eqxopt.Sophia(
            eqxopt.schedules.Linear(0.05, 0.01, 8),
            b1=0.9,
            b2=0.5,
            eps=0.5,
            gamma=0.5,
            clip_threshold=None,
            update_interval=2,
            # An int seed: constructing an optimizer creates no JAX array.
            hessian_diagonal_fn=eqxopt.HutchinsonEstimatorDiagHessian(5),
        ),
        lambda: optax.contrib.sophia(
            optax.linear_schedule(0.05, 0.01, 8),
            b1=0.9,
            b2=0.5,
            eps=0.5,
            gamma=0.5,
            clip_threshold=None,
            update_interval=2,
            hessian_diagonal_fn=optax.contrib.hutchinson_estimator_diag_hessian(
                jax.random.key(5)
            ),
        ),
        loss=_loss,
        extra=_obj_fn,
        # Optax evaluates its schedules in float32 even under x64.
        rtol64=1e-6,
    ),
    # --- Adadelta -----------------------------------------------------------------
    Case(
        "adadelta",
        lambda: eqxopt.Adadelta(
            0.5,
            rho=0.8,
            eps=1e-5,
            weight_decay=0.01,
            weight_decay_mask=lambda p: p.ndim > 1,
        ),
        lambda: optax.adadelta(
            0.5, rho=0.8, eps=1e-5, weight_decay=0.01, weight_decay_mask=ndim2_mask
        ),
        bad=(
            (lambda: eqxopt.Adadelta(-1.0), "learning_rate"),
            (lambda: eqxopt.Adadelta(1.0, rho=1.0), "rho"),
            (lambda: eqxopt.Adadelta(1.0, eps=-1e-6), "eps"),
            (lambda: eqxopt.Adadelta(1.0, weight_decay=-0.1), "weight_decay"),
        ),
    ),
    Case(
        "chain_scale_by_adadelta",
        lambda: eqxopt.Chain(
            eqxopt.ScaleByAdadelta(rho=0.7, eps=1e-4),
            eqxopt.ScaleByLearningRate(eqxopt.schedules.ExponentialDecay(2.0, 3, 0.5)),
        ),
        lambda: optax.chain(
            optax.scale_by_adadelta(rho=0.7, eps=1e-4),
            optax.scale_by_learning_rate(optax.exponential_decay(2.0, 3, 0.5)),
        ),
        rtol64=SCHEDULE_RTOL64_AMPLIFIED,
        bad=((lambda: eqxopt.ScaleByAdadelta(rho=1.5), "rho"),),
    ),
    # --- SM3 -------------------------------------------------------------------------
    Case(
        "sm3",
        lambda: eqxopt.SM3(0.1, momentum=0.8),
        lambda: optax.sm3(0.1, momentum=0.8),
        shapes=NO_SCALAR,
        bad=(
            (lambda: eqxopt.SM3(-0.1), "learning_rate"),
            (lambda: eqxopt.SM3(0.1, momentum=1.0), "momentum"),
        ),
    ),
    Case(
        "chain_scale_by_sm3",
        lambda: eqxopt.Chain(
            eqxopt.ScaleBySM3(b1=0.5, b2=0.9, eps=1e-6), eqxopt.Scale(-0.05)
        ),
        lambda: optax.chain(
            optax.scale_by_sm3(b1=0.5, b2=0.9, eps=1e-6), optax.scale(-0.05)
        ),
        shapes=NO_SCALAR,
        bad=(
            (lambda: eqxopt.ScaleBySM3(b2=1.5), "b2"),
            (lambda: eqxopt.ScaleBySM3(eps=-1.0), "eps"),
        ),
    ),
]
