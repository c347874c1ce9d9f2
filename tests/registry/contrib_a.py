"""Optax's contrib catalogue, part 1: ACProp, COCOB, D-Adaptation AdamW, DoG, DoWG,
MADGRAD, Mechanic, MoMo, MoMo-Adam, Normalize, Simplified AdEMAMix and
SplitRealAndImaginary."""

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import optax

import eqxopt

from ..helpers import Case


# Optax evaluates its schedules in float32 even under x64 (eqxopt's follow the
# params' precision), so float64 parity of scheduled cases is limited to ~1e-7 in the
# learning rate, which the adaptive step sizes below carry into the params.
SCHEDULE_RTOL64 = 1e-5

# Optax's MADGRAD computes lr * sqrt(k + 1) from its int32 count in float32, also for
# float64 params (`jnp.sqrt` of an int32 is float32): float64 parity is limited to
# float32's precision in that factor (measured: 4e-8 relative in the params).
MADGRAD_RTOL64 = 1e-6

# ACProp divides g by the root of the previous prediction-error EMA (eps = 1e-16), so
# coordinates where g is close to its EMA are ill-conditioned. In float32, ours uses
# 1 - b2 rounded from float32's b2 (as every Adam-family optimizer here) where Optax
# rounds the Python float 1 - b2: both are ~1e-5 off the float64 result on such
# coordinates (measured: ours 6e-6, Optax's 1.2e-5, apart 1.8e-5 at worst).
ACPROP_RTOL = 5e-5


def _ndim2(params):
    return jax.tree.map(lambda p: p.ndim > 1, params)


def _own_buffers(tx):
    """`tx` with an `init` that copies its state: Optax's COCOB, DoG, DoWG, MADGRAD and
    Mechanic keep the params themselves in their state, so (params, state) could not
    be donated together to a jitted step (as the update benchmark does). The numbers
    are unchanged."""

    def init(params):
        return jax.tree.map(jnp.copy, tx.init(params))

    return optax.GradientTransformationExtraArgs(init, tx.update)


def _shifted_quadratic(params):
    """0.5 * sum((p - 0.3)^2) + 0.2: a loss with a known lower bound (MoMo's f_*)."""
    leaves = jtu.tree_leaves(params)
    dtype = jnp.float64 if leaves[0].dtype == jnp.float64 else jnp.float32
    total = jnp.asarray(0.2, dtype)
    for p in leaves:
        d = p.astype(dtype) - jnp.asarray(0.3, dtype)
        total = total + jnp.asarray(0.5, dtype) * jnp.sum(d * d)
    return total


def _value(params):
    return {"value": _shifted_quadratic(params)}


CASES = [
    # --- ACProp ----------------------------------------------------------------------
    Case(
        "acprop",
        lambda: eqxopt.AcProp(1e-2),
        lambda: optax.contrib.acprop(1e-2),
        rtol=ACPROP_RTOL,
        bad=(
            (lambda: eqxopt.AcProp(-1e-2), "learning_rate"),
            (lambda: eqxopt.AcProp(1e-2, b1=1.0), "b1"),
            (lambda: eqxopt.AcProp(1e-2, b2=-0.1), "b2"),
            (lambda: eqxopt.AcProp(1e-2, eps=-1.0), "eps"),
            (lambda: eqxopt.AcProp(1e-2, eps_root="1e-16"), "eps_root"),  # pyright: ignore
        ),
        optax_fn="contrib.acprop",
    ),
    Case(
        "acprop_schedule_masked_decay",
        lambda: eqxopt.AcProp(
            eqxopt.schedules.Linear(3e-2, 1e-2, 10),
            b1=0.8,
            b2=0.95,
            eps=1e-8,
            eps_root=1e-10,
            weight_decay=0.1,
            mask=lambda p: p.ndim > 1,
        ),
        lambda: optax.contrib.acprop(
            optax.linear_schedule(3e-2, 1e-2, 10),
            b1=0.8,
            b2=0.95,
            eps=1e-8,
            eps_root=1e-10,
            weight_decay=0.1,
            mask=_ndim2,
        ),
        rtol=ACPROP_RTOL,
        rtol64=SCHEDULE_RTOL64,
        bad=((lambda: eqxopt.AcProp(1e-2, weight_decay=-0.1), "weight_decay"),),
        optax_fn="contrib.acprop",
    ),
    # --- COCOB -----------------------------------------------------------------------
    Case(
        "cocob",
        lambda: eqxopt.COCOB(),
        lambda: _own_buffers(optax.contrib.cocob()),
        bad=(
            (lambda: eqxopt.COCOB(-1.0), "learning_rate"),
            (lambda: eqxopt.COCOB(alpha=0.0), "alpha"),
            (lambda: eqxopt.COCOB(eps=0.0), "eps"),
        ),
        optax_fn="contrib.cocob",
    ),
    Case(
        "cocob_schedule_masked_decay",
        lambda: eqxopt.COCOB(
            eqxopt.schedules.Linear(1.0, 0.5, 10),
            alpha=20.0,
            eps=1e-6,
            weight_decay=0.01,
            mask=lambda p: p.ndim > 1,
        ),
        lambda: _own_buffers(
            optax.contrib.cocob(
                optax.linear_schedule(1.0, 0.5, 10),
                alpha=20.0,
                eps=1e-6,
                weight_decay=0.01,
                mask=_ndim2,
            )
        ),
        rtol64=SCHEDULE_RTOL64,
        bad=((lambda: eqxopt.COCOB(weight_decay=-1.0), "weight_decay"),),
        optax_fn="contrib.cocob",
    ),
    # --- D-Adaptation AdamW ----------------------------------------------------------
    Case(
        "dadapt_adamw",
        lambda: eqxopt.DAdaptAdamW(estim_lr0=1e-3, weight_decay=0.01),
        lambda: optax.contrib.dadapt_adamw(estim_lr0=1e-3, weight_decay=0.01),
        bad=(
            (lambda: eqxopt.DAdaptAdamW(-1.0), "learning_rate"),
            (lambda: eqxopt.DAdaptAdamW(betas=(0.9, 1.0)), "betas"),
            (lambda: eqxopt.DAdaptAdamW(betas=(0.9,)), "betas"),  # pyright: ignore
            (lambda: eqxopt.DAdaptAdamW(eps=-1.0), "eps"),
            (lambda: eqxopt.DAdaptAdamW(estim_lr0=0.0), "estim_lr0"),
            (lambda: eqxopt.DAdaptAdamW(weight_decay=-1.0), "weight_decay"),
        ),
        optax_fn="contrib.dadapt_adamw",
    ),
    Case(
        "dadapt_adamw_schedule",
        lambda: eqxopt.DAdaptAdamW(
            eqxopt.schedules.WarmupCosineDecay(0.1, 1.0, 3, 10),
            betas=(0.8, 0.95),
            eps=1e-6,
            estim_lr0=1e-2,
        ),
        lambda: optax.contrib.dadapt_adamw(
            optax.warmup_cosine_decay_schedule(0.1, 1.0, 3, 10),
            betas=(0.8, 0.95),
            eps=1e-6,
            estim_lr0=1e-2,
        ),
        rtol64=SCHEDULE_RTOL64,
        optax_fn="contrib.dadapt_adamw",
    ),
    # --- DoG, DoWG -------------------------------------------------------------------
    Case(
        "dog",
        lambda: eqxopt.DoG(),
        lambda: _own_buffers(optax.contrib.dog()),
        bad=(
            (lambda: eqxopt.DoG(-1.0), "learning_rate"),
            (lambda: eqxopt.DoG(init_step=("warm", 1e-6)), "init_step"),
            (lambda: eqxopt.DoG(init_step=("distance", -1.0)), "init_step"),
            (lambda: eqxopt.DoG(init_step=1e-6), "init_step"),  # pyright: ignore
            (lambda: eqxopt.DoG(eps=-1.0), "eps"),
            (lambda: eqxopt.DoG(weight_decay=-1.0), "weight_decay"),
        ),
        optax_fn="contrib.dog",
    ),
    Case(
        "dog_distance_schedule_masked_decay",
        lambda: eqxopt.DoG(
            eqxopt.schedules.CosineDecay(1.0, 10),
            init_step=("distance", 1e-2),
            eps=1e-6,
            weight_decay=1e-2,
            mask=lambda p: p.ndim > 1,
        ),
        lambda: _own_buffers(
            optax.contrib.dog(
                optax.cosine_decay_schedule(1.0, 10),
                init_step=("distance", 1e-2),
                eps=1e-6,
                weight_decay=1e-2,
                mask=_ndim2,
            )
        ),
        rtol64=SCHEDULE_RTOL64,
        optax_fn="contrib.dog",
    ),
    Case(
        "dog_learning_rate_init",
        lambda: eqxopt.DoG(0.5, init_step=("learning_rate", 0.1)),
        lambda: _own_buffers(optax.contrib.dog(0.5, init_step=("learning_rate", 0.1))),
        optax_fn="contrib.dog",
    ),
    Case(
        "dowg",
        lambda: eqxopt.DoWG(),
        lambda: _own_buffers(optax.contrib.dowg()),
        bad=(
            (lambda: eqxopt.DoWG(-1.0), "learning_rate"),
            (lambda: eqxopt.DoWG(init_estim_sq_dist=0.0), "init_estim_sq_dist"),
            (lambda: eqxopt.DoWG(eps=-1.0), "eps"),
            (lambda: eqxopt.DoWG(weight_decay=-1.0), "weight_decay"),
        ),
        optax_fn="contrib.dowg",
    ),
    Case(
        "dowg_init_masked_decay",
        lambda: eqxopt.DoWG(
            0.5,
            init_estim_sq_dist=1e-2,
            eps=1e-6,
            weight_decay=1e-2,
            mask=lambda p: p.ndim > 1,
        ),
        lambda: _own_buffers(
            optax.contrib.dowg(
                0.5, init_estim_sq_dist=1e-2, eps=1e-6, weight_decay=1e-2, mask=_ndim2
            )
        ),
        optax_fn="contrib.dowg",
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
        rtol64=max(SCHEDULE_RTOL64, MADGRAD_RTOL64),
        optax_fn="contrib.madgrad",
    ),
    # --- Mechanic --------------------------------------------------------------------
    Case(
        "mechanize_adam",
        lambda: eqxopt.Mechanize(eqxopt.Adam(1.0)),
        lambda: _own_buffers(optax.contrib.mechanize(optax.adam(1.0))),
        bad=(
            (lambda: eqxopt.Mechanize(optax.adam(1.0)), "base_optimizer"),  # pyright: ignore
            (lambda: eqxopt.Mechanize(eqxopt.SGD(1.0), -1.0), "weight_decay"),
            (lambda: eqxopt.Mechanize(eqxopt.SGD(1.0), eps=-1.0), "eps"),
            (lambda: eqxopt.Mechanize(eqxopt.SGD(1.0), s_init=-1.0), "s_init"),
            (lambda: eqxopt.Mechanize(eqxopt.SGD(1.0), num_betas=0), "num_betas"),
        ),
        optax_fn="contrib.mechanize",
    ),
    Case(
        "mechanize_sgd_options",
        lambda: eqxopt.Mechanize(
            eqxopt.SGD(0.5, momentum=0.9),
            weight_decay=0.1,
            eps=1e-6,
            s_init=1e-3,
            num_betas=3,
        ),
        lambda: _own_buffers(
            optax.contrib.mechanize(
                optax.sgd(0.5, momentum=0.9),
                weight_decay=0.1,
                eps=1e-6,
                s_init=1e-3,
                num_betas=3,
            )
        ),
        optax_fn="contrib.mechanize",
    ),
    # --- MoMo, MoMo-Adam -------------------------------------------------------------
    Case(
        "momo",
        lambda: eqxopt.Momo(),
        lambda: optax.contrib.momo(),
        loss=_shifted_quadratic,
        extra=_value,
        bad=(
            (lambda: eqxopt.Momo(-1.0), "learning_rate"),
            (lambda: eqxopt.Momo(beta=1.0), "beta"),
            (lambda: eqxopt.Momo(lower_bound="0"), "lower_bound"),  # pyright: ignore
            (lambda: eqxopt.Momo(weight_decay=-1.0), "weight_decay"),
        ),
        optax_fn="contrib.momo",
    ),
    Case(
        "momo_adapt_lower_bound_decay",
        lambda: eqxopt.Momo(
            eqxopt.schedules.Linear(0.5, 0.1, 10),
            beta=0.8,
            lower_bound=0.1,
            weight_decay=1e-2,
            adapt_lower_bound=True,
        ),
        lambda: optax.contrib.momo(
            optax.linear_schedule(0.5, 0.1, 10),
            beta=0.8,
            lower_bound=0.1,
            weight_decay=1e-2,
            adapt_lower_bound=True,
        ),
        loss=_shifted_quadratic,
        extra=_value,
        rtol64=SCHEDULE_RTOL64,
        optax_fn="contrib.momo",
    ),
    Case(
        "momo_adam",
        lambda: eqxopt.MomoAdam(),
        lambda: optax.contrib.momo_adam(),
        loss=_shifted_quadratic,
        extra=_value,
        bad=(
            (lambda: eqxopt.MomoAdam(-1.0), "learning_rate"),
            (lambda: eqxopt.MomoAdam(b1=1.0), "b1"),
            (lambda: eqxopt.MomoAdam(b2=1.5), "b2"),
            (lambda: eqxopt.MomoAdam(eps=-1.0), "eps"),
            (lambda: eqxopt.MomoAdam(weight_decay=-1.0), "weight_decay"),
        ),
        optax_fn="contrib.momo_adam",
    ),
    Case(
        "momo_adam_adapt_lower_bound_decay",
        lambda: eqxopt.MomoAdam(
            0.1,
            b1=0.8,
            b2=0.95,
            eps=1e-6,
            lower_bound=0.1,
            weight_decay=1e-2,
            adapt_lower_bound=True,
        ),
        lambda: optax.contrib.momo_adam(
            0.1,
            b1=0.8,
            b2=0.95,
            eps=1e-6,
            lower_bound=0.1,
            weight_decay=1e-2,
            adapt_lower_bound=True,
        ),
        loss=_shifted_quadratic,
        extra=_value,
        optax_fn="contrib.momo_adam",
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
    # --- Simplified AdEMAMix ---------------------------------------------------------
    Case(
        "simplified_ademamix",
        lambda: eqxopt.SimplifiedAdEMAMix(1e-2),
        lambda: optax.contrib.simplified_ademamix(1e-2),
        bad=(
            (lambda: eqxopt.SimplifiedAdEMAMix(-1e-2), "learning_rate"),
            (lambda: eqxopt.SimplifiedAdEMAMix(1e-2, b1=1.0), "b1"),
            (lambda: eqxopt.SimplifiedAdEMAMix(1e-2, b2=-0.5), "b2"),
            (lambda: eqxopt.SimplifiedAdEMAMix(1e-2, alpha=-1.0), "alpha"),
            (lambda: eqxopt.SimplifiedAdEMAMix(1e-2, eps=-1.0), "eps"),
            (lambda: eqxopt.SimplifiedAdEMAMix(1e-2, eps_root=-1.0), "eps_root"),
            (
                lambda: eqxopt.SimplifiedAdEMAMix(1e-2, weight_decay=-1.0),
                "weight_decay",
            ),
        ),
        optax_fn="contrib.simplified_ademamix",
    ),
    Case(
        "simplified_ademamix_alpha_schedule_masked_decay",
        lambda: eqxopt.SimplifiedAdEMAMix(
            eqxopt.schedules.Linear(1e-2, 5e-3, 10),
            b1=0.9,
            b2=0.9,
            alpha=eqxopt.schedules.Linear(0.5, 5.0, 10),
            eps=1e-6,
            eps_root=1e-8,
            weight_decay=0.1,
            mask=lambda p: p.ndim > 1,
        ),
        lambda: optax.contrib.simplified_ademamix(
            optax.linear_schedule(1e-2, 5e-3, 10),
            b1=0.9,
            b2=0.9,
            alpha=optax.linear_schedule(0.5, 5.0, 10),
            eps=1e-6,
            eps_root=1e-8,
            weight_decay=0.1,
            mask=_ndim2,
        ),
        rtol64=SCHEDULE_RTOL64,
        optax_fn="contrib.simplified_ademamix",
    ),
    # --- SplitRealAndImaginary (real params pass through; complex ones are tested in
    # tests/test_contrib_a.py) -------------------------------------------------------
    Case(
        "split_real_and_imaginary_adam",
        lambda: eqxopt.SplitRealAndImaginary(eqxopt.Adam(1e-2)),
        lambda: optax.contrib.split_real_and_imaginary(optax.adam(1e-2)),
        bad=((lambda: eqxopt.SplitRealAndImaginary(optax.adam(1e-2)), "inner"),),  # pyright: ignore
        optax_fn="contrib.split_real_and_imaginary",
    ),
]
