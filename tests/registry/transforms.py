"""Building blocks (scaling, clipping, weight decay, normalisations, trust ratio,
NaN zeroing, projections, plateau schedules), in the chains Optax builds them in."""

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import optax

import eqxopt

from ..helpers import Case


# Optax evaluates schedules in float32 even under x64 (an int32 count divided by a
# Python int), eqxopt in float64: scheduled cases agree to float32 precision only.
SCHEDULE_RTOL64, SCHEDULE_ATOL64 = 1e-6, 1e-8


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


def _value(params):
    return {"value": _loss(params)}


# Shapes without a rank-0 leaf, for Optax transforms that cannot take one (SM3, and
# AGC with an explicit `axis`).
NO_SCALAR = {"w": (5, 3), "b": (5,), "k": (2, 3, 4)}


def _sqrt_loss(params):
    """A loss whose gradient is NaN wherever a param is negative (ZeroNans' job)."""
    leaves = jtu.tree_leaves(params)
    return sum(jnp.sum(jnp.sqrt(p) + 0.5 * p * p) for p in leaves)


CASES = [
    Case(
        "chain_clip_adam_decay",
        lambda: eqxopt.Chain(
            eqxopt.ClipByGlobalNorm(1.0),
            eqxopt.ScaleByAdam(b1=0.8),
            eqxopt.AddDecayedWeights(1e-2, mask=lambda p: p.ndim == 2),
            eqxopt.ScaleByLearningRate(eqxopt.schedules.ExponentialDecay(1e-2, 5, 0.5)),
        ),
        lambda: optax.chain(
            optax.clip_by_global_norm(1.0),
            optax.scale_by_adam(b1=0.8),
            optax.add_decayed_weights(
                1e-2, mask=lambda ps: jax.tree.map(lambda p: p.ndim == 2, ps)
            ),
            optax.scale_by_learning_rate(optax.exponential_decay(1e-2, 5, 0.5)),
        ),
        rtol64=SCHEDULE_RTOL64,
        atol64=SCHEDULE_ATOL64,
        bad=(
            (lambda: eqxopt.ClipByGlobalNorm(-1.0), "max_norm"),
            (lambda: eqxopt.AddDecayedWeights(-1.0), "weight_decay"),
        ),
    ),
    Case(
        "chain_clip_trace_scale",
        lambda: eqxopt.Chain(
            eqxopt.Clip(0.5), eqxopt.Trace(0.9, nesterov=True), eqxopt.Scale(-0.05)
        ),
        lambda: optax.chain(
            optax.clip(0.5), optax.trace(0.9, nesterov=True), optax.scale(-0.05)
        ),
        bad=((lambda: eqxopt.Clip(-1.0), "max_delta"),),
    ),
    Case(
        "chain_adam_scale_by_trust_ratio",
        lambda: eqxopt.Chain(
            eqxopt.ScaleByAdam(b1=0.8),
            eqxopt.ScaleByTrustRatio(min_norm=0.5, trust_coefficient=0.3, eps=1e-6),
            eqxopt.ScaleByLearningRate(1e-2),
        ),
        lambda: optax.chain(
            optax.scale_by_adam(b1=0.8),
            optax.scale_by_trust_ratio(min_norm=0.5, trust_coefficient=0.3, eps=1e-6),
            optax.scale_by_learning_rate(1e-2),
        ),
        bad=(
            (lambda: eqxopt.ScaleByAdam(b2=1.0), "b2"),
            (lambda: eqxopt.ScaleByTrustRatio(min_norm=-1.0), "min_norm"),
        ),
    ),
    # --- Normalize -------------------------------------------------------------------
    Case(
        "normalize",
        lambda: eqxopt.Normalize(),
        lambda: optax.contrib.normalize(),
        optax_fn="contrib.normalize",
    ),
    Case(
        "chain_normalize",
        lambda: eqxopt.Chain(eqxopt.Normalize(), eqxopt.ScaleByLearningRate(0.1)),
        lambda: optax.chain(
            optax.contrib.normalize(), optax.scale_by_learning_rate(0.1)
        ),
    ),
    # --- ReduceOnPlateau (positive losses: the same decisions as Optax) --------------
    Case(
        "reduce_on_plateau",
        lambda: eqxopt.Chain(
            eqxopt.Adam(5e-3),
            eqxopt.ReduceOnPlateau(
                factor=0.5, patience=2, rtol=0.05, cooldown=1, accumulation_size=2
            ),
        ),
        lambda: optax.chain(
            optax.adam(5e-3),
            optax.contrib.reduce_on_plateau(
                factor=0.5, patience=2, rtol=0.05, cooldown=1, accumulation_size=2
            ),
        ),
        loss=_loss,
        extra=_value,
        steps=16,
    ),
    Case(
        "reduce_on_plateau_alone",
        lambda: eqxopt.ReduceOnPlateau(0.5, 1, 0.1, 0.01, 1, 1, 0.2),
        lambda: optax.contrib.reduce_on_plateau(0.5, 1, 0.1, 0.01, 1, 1, 0.2),
        extra=_value,  # random grads: the loss goes up and down
        optax_fn="contrib.reduce_on_plateau",
        bad=(
            (lambda: eqxopt.ReduceOnPlateau(factor=1.0), "factor"),
            (lambda: eqxopt.ReduceOnPlateau(factor=0.0), "factor"),
            (lambda: eqxopt.ReduceOnPlateau(rtol=-1e-3), "rtol"),
            (lambda: eqxopt.ReduceOnPlateau(rtol=2.0), "rtol"),
            (lambda: eqxopt.ReduceOnPlateau(atol=-1.0), "atol"),
            (lambda: eqxopt.ReduceOnPlateau(rtol=0.0, atol=0.0), "atol"),
            (lambda: eqxopt.ReduceOnPlateau(patience=-1), "patience"),
            (lambda: eqxopt.ReduceOnPlateau(cooldown=-1), "cooldown"),
            (lambda: eqxopt.ReduceOnPlateau(accumulation_size=0), "accumulation_size"),
            (lambda: eqxopt.ReduceOnPlateau(min_scale=-1.0), "min_scale"),
        ),
    ),
    # --- small transforms -----------------------------------------------------------
    Case(
        "chain_centralize_sign_sgd",
        lambda: eqxopt.Chain(
            eqxopt.Centralize(), eqxopt.ScaleBySign(), eqxopt.SGD(0.1, momentum=0.5)
        ),
        lambda: optax.chain(
            optax.centralize(), optax.scale_by_sign(), optax.sgd(0.1, momentum=0.5)
        ),
    ),
    Case(
        "chain_agc_sgd",
        lambda: eqxopt.Chain(
            eqxopt.AdaptiveGradClip(0.05, eps=1e-2, axis=0), eqxopt.SGD(0.1)
        ),
        lambda: optax.chain(
            optax.adaptive_grad_clip(0.05, eps=1e-2, axis=0), optax.sgd(0.1)
        ),
        shapes=NO_SCALAR,
        bad=(
            (lambda: eqxopt.AdaptiveGradClip(-1.0), "clipping"),
            (lambda: eqxopt.AdaptiveGradClip(0.1, eps=-1.0), "eps"),
            (lambda: eqxopt.AdaptiveGradClip(0.1, axis="rows"), "axis"),  # pyright: ignore
        ),
    ),
    Case(
        "chain_sgd_keep_nonnegative",
        lambda: eqxopt.Chain(eqxopt.SGD(0.3), eqxopt.KeepParamsNonnegative()),
        lambda: optax.chain(optax.sgd(0.3), optax.keep_params_nonnegative()),
    ),
    Case(
        "chain_block_scalings",
        lambda: eqxopt.Chain(
            eqxopt.ClipByBlockRms(0.5),
            eqxopt.ScaleByParamBlockRms(0.8),
            eqxopt.ScaleByParamBlockNorm(1e-2),
            eqxopt.NormalizeByUpdateNorm(scale_factor=-0.1, eps=1e-4),
        ),
        lambda: optax.chain(
            optax.clip_by_block_rms(0.5),
            optax.scale_by_param_block_rms(0.8),
            optax.scale_by_param_block_norm(1e-2),
            optax.normalize_by_update_norm(scale_factor=-0.1, eps=1e-4),
        ),
        bad=(
            (lambda: eqxopt.ScaleByParamBlockNorm(-1.0), "min_scale"),
            (lambda: eqxopt.ScaleByParamBlockRms(-1.0), "min_scale"),
            (lambda: eqxopt.ClipByBlockRms(0.0), "threshold"),
            (lambda: eqxopt.NormalizeByUpdateNorm(eps=-1.0), "eps"),
        ),
    ),
    Case(
        "chain_zero_nans_adam",
        lambda: eqxopt.Chain(eqxopt.ZeroNans(), eqxopt.Adam(1e-2, b1=0.8)),
        lambda: optax.chain(optax.zero_nans(), optax.adam(1e-2, b1=0.8)),
        loss=_sqrt_loss,
    ),
]
