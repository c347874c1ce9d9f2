"""Learning-rate-free methods (Prodigy, D-Adaptation, DoG, DoWG, COCOB, Mechanic,
MoMo, Polyak steps), each against its Optax counterpart."""

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import optax

import eqxopt

from ..helpers import Case, ndim2_mask


def _quadratic_above(floor: float):
    """The loss `0.5 * sum((p - 0.3)^2) + floor`, whose minimum `floor` is known,
    computed in at least float32."""

    def loss(params):
        leaves = jtu.tree_leaves(params)
        dtype = jnp.float64 if leaves[0].dtype == jnp.float64 else jnp.float32
        total = jnp.asarray(floor, dtype)
        for p in leaves:
            d = p.astype(dtype) - jnp.asarray(0.3, dtype)
            total = total + jnp.asarray(0.5, dtype) * jnp.sum(d * d)
        return total

    return loss


# Built once, so that jitted steps see the same function (no retrace).
_shifted_quadratic = _quadratic_above(0.2)  # MoMo's lower bound f_*
_polyak_quadratic = _quadratic_above(0.1)  # the Polyak step's known minimum


def _value(params):
    return {"value": _shifted_quadratic(params)}


# Optax evaluates its schedules in float32 even under x64 (eqxopt's follow the
# params' precision), so float64 parity of scheduled cases is limited to ~1e-7 in the
# learning rate, which scale-invariant steps (Fromage, Prodigy) amplify to ~1e-5.
SCHEDULE_RTOL64_AMPLIFIED = 1e-5


def _polyak_value(params):
    return {"value": _polyak_quadratic(params)}


def _own_buffers(tx):
    """`tx` with an `init` that copies its state: `optax.contrib.prodigy` keeps the
    params themselves as `params0`, so (params, state) could not be donated together
    to a jitted step (as the update benchmark does). The numbers are unchanged."""

    def init(params):
        return jax.tree.map(jnp.copy, tx.init(params))

    return optax.GradientTransformationExtraArgs(init, tx.update)


CASES = [
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
                mask=ndim2_mask,
            )
        ),
        rtol64=SCHEDULE_RTOL64_AMPLIFIED,
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
        rtol64=SCHEDULE_RTOL64_AMPLIFIED,
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
                mask=ndim2_mask,
            )
        ),
        rtol64=SCHEDULE_RTOL64_AMPLIFIED,
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
                0.5,
                init_estim_sq_dist=1e-2,
                eps=1e-6,
                weight_decay=1e-2,
                mask=ndim2_mask,
            )
        ),
        optax_fn="contrib.dowg",
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
        rtol64=SCHEDULE_RTOL64_AMPLIFIED,
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
    # --- Polyak ----------------------------------------------------------------------
    Case(
        "polyak_sgd",
        lambda: eqxopt.PolyakSGD(
            max_learning_rate=0.5,
            scaling=eqxopt.schedules.Linear(1.0, 0.5, 10),
            f_min=0.05,
            eps=1e-3,
            variant="sps+",
        ),
        lambda: optax.polyak_sgd(
            max_learning_rate=0.5,
            scaling=optax.linear_schedule(1.0, 0.5, 10),
            f_min=0.05,
            eps=1e-3,
            variant="sps+",
        ),
        loss=_polyak_quadratic,
        extra=_polyak_value,
        rtol64=SCHEDULE_RTOL64_AMPLIFIED,
        bad=(
            (lambda: eqxopt.PolyakSGD(max_learning_rate=-1.0), "max_learning_rate"),
            (lambda: eqxopt.PolyakSGD(scaling=-1.0), "scaling"),
            (lambda: eqxopt.PolyakSGD(eps=-1.0), "eps"),
            (lambda: eqxopt.PolyakSGD(variant="sps++"), "variant"),
        ),
    ),
    Case(
        "chain_sgd_scale_by_polyak",
        lambda: eqxopt.Chain(
            eqxopt.SGD(0.7),
            eqxopt.ScaleByPolyak(f_min=0.1, max_learning_rate=0.8, eps=1e-4),
        ),
        lambda: optax.chain(
            optax.sgd(0.7),
            optax.scale_by_polyak(f_min=0.1, max_learning_rate=0.8, eps=1e-4),
        ),
        loss=_polyak_quadratic,
        extra=_polyak_value,
        bad=((lambda: eqxopt.ScaleByPolyak(variant="armijo"), "variant"),),
    ),
    # --- Prodigy ---------------------------------------------------------------------
    Case(
        "prodigy",
        lambda: eqxopt.Prodigy(
            0.9,
            betas=(0.85, 0.99),
            beta3=0.95,
            eps=1e-7,
            estim_lr0=1e-3,
            estim_lr_coef=0.9,
            weight_decay=0.01,
        ),
        lambda: _own_buffers(
            optax.contrib.prodigy(
                0.9,
                betas=(0.85, 0.99),
                beta3=0.95,
                eps=1e-7,
                estim_lr0=1e-3,
                estim_lr_coef=0.9,
                weight_decay=0.01,
            )
        ),
        bad=(
            (lambda: eqxopt.Prodigy(-1.0), "learning_rate"),
            (lambda: eqxopt.Prodigy(betas=(1.0, 0.999)), "betas"),
            (lambda: eqxopt.Prodigy(betas=(0.9,)), "betas"),  # pyright: ignore
            (lambda: eqxopt.Prodigy(beta3=1.0), "beta3"),
            (lambda: eqxopt.Prodigy(estim_lr0=0.0), "estim_lr0"),
            (lambda: eqxopt.Prodigy(eps=-1.0), "eps"),
            (lambda: eqxopt.Prodigy(weight_decay=-0.1), "weight_decay"),
        ),
    ),
    Case(
        "prodigy_safeguard_schedule",
        lambda: eqxopt.Prodigy(
            eqxopt.schedules.WarmupCosineDecay(0.0, 1.0, 3, 10),
            betas=(0.8, 0.95),
            estim_lr0=1e-2,
            safeguard_warmup=True,
        ),
        lambda: _own_buffers(
            optax.contrib.prodigy(
                optax.warmup_cosine_decay_schedule(0.0, 1.0, 3, 10),
                betas=(0.8, 0.95),
                estim_lr0=1e-2,
                safeguard_warmup=True,
            )
        ),
        rtol64=SCHEDULE_RTOL64_AMPLIFIED,
    ),
]
