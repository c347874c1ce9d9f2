"""Variants beyond the adaptive family: Adadelta, sign methods, Fromage, gradient noise,
Polyak SGD, SM3, Prodigy, ADOPT, AdEMAMix, Adan, Lookahead, and the small transforms
(Centralize, AGC, EMA, ParamsEMA, KeepParamsNonnegative, block scalings)."""

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import optax

import eqxopt

from ..helpers import Case


# Shapes without a rank-0 leaf, for Optax transforms that cannot take one (SM3, and
# AGC with an explicit `axis`).
NO_SCALAR = {"w": (5, 3), "b": (5,), "k": (2, 3, 4)}

# Optax evaluates its schedules in float32 even under x64 (eqxopt's follow the
# params' precision), so float64 parity of scheduled cases is limited to ~1e-7 in the
# learning rate, which scale-invariant steps (Fromage, Prodigy) amplify to ~1e-5.
SCHEDULE_RTOL64 = 1e-5


def _ndim2(params):
    return jax.tree.map(lambda p: p.ndim > 1, params)


def _shifted_quadratic(params):
    """0.5 * sum((p - 0.3)^2) + 0.1: a loss with a known minimum, for Polyak steps."""
    leaves = jtu.tree_leaves(params)
    dtype = jnp.float64 if leaves[0].dtype == jnp.float64 else jnp.float32
    total = jnp.asarray(0.1, dtype)
    for p in leaves:
        d = p.astype(dtype) - jnp.asarray(0.3, dtype)
        total = total + jnp.asarray(0.5, dtype) * jnp.sum(d * d)
    return total


def _value(params):
    return {"value": _shifted_quadratic(params)}


def _adopt_clip(count):
    return 0.5 + 0.25 * count


def _fast_only(lookahead):
    """`optax.lookahead` on plain params: the slow params are kept in the state (as
    eqxopt does), and the fast params and updates are Optax's `.fast` ones."""

    def init(params):
        slow = jax.tree.map(jnp.copy, params)  # own buffers: (params, state) donatable
        return lookahead.init(optax.LookaheadParams.init_synced(params)), slow

    def update(updates, state, params=None, **extra):
        if params is None:
            raise ValueError("optax.lookahead needs `params`.")
        inner, slow = state
        pair = optax.LookaheadParams(fast=params, slow=slow)
        pair_updates, inner = lookahead.update(updates, inner, pair)
        new_slow = optax.apply_updates(slow, pair_updates.slow)
        return pair_updates.fast, (inner, new_slow)

    return optax.GradientTransformationExtraArgs(init, update)


def _own_buffers(tx):
    """`tx` with an `init` that copies its state: `optax.contrib.prodigy` keeps the
    params themselves as `params0`, so (params, state) could not be donated together
    to a jitted step (as the update benchmark does). The numbers are unchanged."""

    def init(params):
        return jax.tree.map(jnp.copy, tx.init(params))

    return optax.GradientTransformationExtraArgs(init, tx.update)


def _with_params_ema(tx, decay):
    """An Optax optimizer that also keeps an EMA of the params (what
    `eqxopt.ParamsEMA` does), written with `optax.incremental_update`: the updates are
    `tx`'s, so this is ParamsEMA's parity reference and its fair benchmark."""

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return tx.init(params), zeros, jnp.zeros((), jnp.int32)

    def update(updates, state, params=None, **extra):
        if params is None:
            raise ValueError("`_with_params_ema` needs `params`.")
        inner, ema, count = state
        updates, inner = tx.update(updates, inner, params)
        new_params = optax.apply_updates(params, updates)
        ema = optax.incremental_update(new_params, ema, 1 - decay)
        return updates, (inner, ema, count + 1)

    return optax.GradientTransformationExtraArgs(init, update)


CASES = [
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
            0.5, rho=0.8, eps=1e-5, weight_decay=0.01, weight_decay_mask=_ndim2
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
        rtol64=SCHEDULE_RTOL64,
        bad=((lambda: eqxopt.ScaleByAdadelta(rho=1.5), "rho"),),
    ),
    # --- sign methods ----------------------------------------------------------------
    Case(
        "sign_sgd",
        lambda: eqxopt.SignSGD(0.03),
        lambda: optax.sign_sgd(0.03),
        bad=((lambda: eqxopt.SignSGD(-0.1), "learning_rate"),),
    ),
    Case(
        "signum",
        lambda: eqxopt.Signum(0.02, beta=0.8),
        lambda: optax.signum(0.02, beta=0.8),
        bad=((lambda: eqxopt.Signum(0.1, beta=1.0), "beta"),),
    ),
    # --- Fromage ---------------------------------------------------------------------
    Case(
        "fromage",
        lambda: eqxopt.Fromage(0.05, min_norm=1e-4),
        lambda: optax.fromage(0.05, min_norm=1e-4),
        bad=(
            (lambda: eqxopt.Fromage(-0.1), "learning_rate"),
            (lambda: eqxopt.Fromage(0.1, min_norm=-1.0), "min_norm"),
        ),
    ),
    # --- gradient noise (same key usage as Optax: parity holds exactly) -------------
    Case(
        "noisy_sgd",
        lambda: eqxopt.NoisySGD(0.05, eta=0.02, gamma=0.6, key=3),
        lambda: optax.noisy_sgd(0.05, eta=0.02, gamma=0.6, key=3),
        bad=(
            (lambda: eqxopt.NoisySGD(-0.1), "learning_rate"),
            (lambda: eqxopt.NoisySGD(0.1, eta=-1.0), "eta"),
            (lambda: eqxopt.NoisySGD(0.1, gamma=-0.5), "gamma"),
            (lambda: eqxopt.NoisySGD(0.1, key="seed"), "key"),
        ),
    ),
    Case(
        "add_noise",
        lambda: eqxopt.AddNoise(0.05, 0.5, key=7),
        lambda: optax.add_noise(0.05, 0.5, key=7),
        bad=((lambda: eqxopt.AddNoise(-1.0, 0.5), "eta"),),
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
        loss=_shifted_quadratic,
        extra=_value,
        rtol64=SCHEDULE_RTOL64,
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
        loss=_shifted_quadratic,
        extra=_value,
        bad=((lambda: eqxopt.ScaleByPolyak(variant="armijo"), "variant"),),
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
        rtol64=SCHEDULE_RTOL64,
    ),
    # --- ADOPT -----------------------------------------------------------------------
    Case(
        "adopt",
        lambda: eqxopt.ADOPT(1e-2, b1=0.8, b2=0.99, eps=1e-5),
        lambda: optax.contrib.adopt(1e-2, b1=0.8, b2=0.99, eps=1e-5),
        bad=(
            (lambda: eqxopt.ADOPT(-1e-3), "learning_rate"),
            (lambda: eqxopt.ADOPT(1e-3, b1=1.0), "b1"),
            (lambda: eqxopt.ADOPT(1e-3, b2=-0.1), "b2"),
            (lambda: eqxopt.ADOPT(1e-3, eps=-1.0), "eps"),
            (lambda: eqxopt.ADOPT(1e-3, clip_value_fn=3.0), "clip_value_fn"),  # pyright: ignore
        ),
    ),
    Case(
        "adopt_nesterov_clip_fn",
        lambda: eqxopt.ADOPT(
            3e-2, b1=0.7, b2=0.95, eps=1e-4, nesterov=True, clip_value_fn=_adopt_clip
        ),
        lambda: optax.contrib.adopt(
            3e-2, b1=0.7, b2=0.95, eps=1e-4, nesterov=True, clip_value_fn=_adopt_clip
        ),
    ),
    # --- AdEMAMix --------------------------------------------------------------------
    Case(
        "ademamix",
        lambda: eqxopt.AdEMAMix(
            1e-2,
            b1=0.85,
            b2=0.99,
            b3=0.995,
            alpha=3.0,
            eps=1e-6,
            eps_root=1e-8,
            weight_decay=0.05,
            mask=lambda p: p.ndim > 1,
        ),
        lambda: optax.contrib.ademamix(
            1e-2,
            b1=0.85,
            b2=0.99,
            b3=0.995,
            alpha=3.0,
            eps=1e-6,
            eps_root=1e-8,
            weight_decay=0.05,
            mask=_ndim2,
        ),
        bad=(
            (lambda: eqxopt.AdEMAMix(1e-3, b1=1.0), "b1"),
            (lambda: eqxopt.AdEMAMix(1e-3, b3=1.0), "b3"),
            (lambda: eqxopt.AdEMAMix(1e-3, alpha=-1.0), "alpha"),
            (lambda: eqxopt.AdEMAMix(1e-3, weight_decay=-0.1), "weight_decay"),
        ),
    ),
    Case(
        "ademamix_schedules",
        lambda: eqxopt.AdEMAMix(
            eqxopt.schedules.CosineDecay(1e-2, 10),
            b3=eqxopt.schedules.Linear(0.9, 0.999, 8),
            alpha=eqxopt.schedules.Linear(0.0, 5.0, 8),
        ),
        lambda: optax.contrib.ademamix(
            optax.cosine_decay_schedule(1e-2, 10),
            b3=optax.linear_schedule(0.9, 0.999, 8),
            alpha=optax.linear_schedule(0.0, 5.0, 8),
        ),
        rtol64=SCHEDULE_RTOL64,
    ),
    # --- Adan ------------------------------------------------------------------------
    Case(
        "adan",
        lambda: eqxopt.AdaN(
            1e-2,
            b1=0.9,
            b2=0.85,
            b3=0.95,
            eps=1e-6,
            eps_root=1e-7,
            weight_decay=0.02,
            mask=lambda p: p.ndim > 1,
        ),
        lambda: optax.adan(
            1e-2,
            b1=0.9,
            b2=0.85,
            b3=0.95,
            eps=1e-6,
            eps_root=1e-7,
            weight_decay=0.02,
            mask=_ndim2,
        ),
        bad=(
            (lambda: eqxopt.AdaN(1e-3, b1=1.0), "b1"),
            (lambda: eqxopt.AdaN(1e-3, b3=1.2), "b3"),
            (lambda: eqxopt.AdaN(1e-3, eps_root=-1.0), "eps_root"),
            (lambda: eqxopt.AdaN(-1e-3), "learning_rate"),
        ),
    ),
    Case(
        "chain_scale_by_adan",
        lambda: eqxopt.Chain(
            eqxopt.ScaleByAdaN(b1=0.95, b2=0.9, b3=0.98, eps=1e-7),
            eqxopt.ScaleByLearningRate(2e-2),
        ),
        lambda: optax.chain(
            optax.scale_by_adan(b1=0.95, b2=0.9, b3=0.98, eps=1e-7),
            optax.scale_by_learning_rate(2e-2),
        ),
        bad=((lambda: eqxopt.ScaleByAdaN(b2=1.0), "b2"),),
    ),
    # --- Rprop, optimistic methods ---------------------------------------------------
    Case(
        "rprop",
        lambda: eqxopt.Rprop(
            0.02, eta_minus=0.4, eta_plus=1.5, min_step_size=1e-3, max_step_size=0.05
        ),
        # No Optax reference: optax 0.2.8's `scale_by_rprop` emits the previous step's
        # update (one step stale, zero at first; optax PR #1725). eqxopt follows the
        # paper and torch.optim.Rprop, checked in NumPy in test_variants.py.
        None,
        bad=(
            (lambda: eqxopt.Rprop(-0.1), "learning_rate"),
            (lambda: eqxopt.Rprop(0.1, eta_minus=0.0), "eta_minus"),
            (lambda: eqxopt.Rprop(0.1, min_step_size=-1.0), "min_step_size"),
        ),
    ),
    Case(
        "optimistic_gradient_descent",
        lambda: eqxopt.OptimisticGradientDescent(0.05, alpha=0.7, beta=0.4),
        lambda: optax.optimistic_gradient_descent(0.05, alpha=0.7, beta=0.4),
        bad=((lambda: eqxopt.OptimisticGradientDescent(-0.1), "learning_rate"),),
    ),
    Case(
        "optimistic_adam",
        lambda: eqxopt.OptimisticAdam(
            1e-2, alpha=0.8, beta=0.6, b1=0.85, b2=0.99, eps=1e-6
        ),
        lambda: optax.optimistic_adam_v2(
            1e-2, alpha=0.8, beta=0.6, b1=0.85, b2=0.99, eps=1e-6
        ),
        optax_fn="optimistic_adam_v2",
        bad=(
            (lambda: eqxopt.OptimisticAdam(1e-3, b1=1.0), "b1"),
            (lambda: eqxopt.OptimisticAdam(1e-3, eps=-1.0), "eps"),
        ),
    ),
    # --- Lookahead -------------------------------------------------------------------
    Case(
        "lookahead_adam",
        lambda: eqxopt.Lookahead(
            eqxopt.Adam(1e-2, b1=0.8), sync_period=3, slow_step_size=0.6
        ),
        lambda: _fast_only(optax.lookahead(optax.adam(1e-2, b1=0.8), 3, 0.6)),
        bad=(
            (lambda: eqxopt.Lookahead(eqxopt.SGD(0.1), 0, 0.5), "sync_period"),
            (lambda: eqxopt.Lookahead(eqxopt.SGD(0.1), 2.5, 0.5), "sync_period"),  # pyright: ignore
            (lambda: eqxopt.Lookahead(eqxopt.SGD(0.1), 2, 1.5), "slow_step_size"),
            (lambda: eqxopt.Lookahead(optax.sgd(0.1), 2, 0.5), "fast_optimizer"),  # pyright: ignore
        ),
    ),
    Case(
        "lookahead_reset_sgd",
        lambda: eqxopt.Lookahead(
            eqxopt.SGD(0.05, momentum=0.9),
            sync_period=4,
            slow_step_size=0.3,
            reset_state=True,
        ),
        lambda: _fast_only(
            optax.lookahead(optax.sgd(0.05, momentum=0.9), 4, 0.3, reset_state=True)
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
        "chain_ema",
        lambda: eqxopt.Chain(
            eqxopt.EMA(0.8),
            eqxopt.EMA(0.6, debias=False),
            eqxopt.ScaleByOptimisticGradient(alpha=0.5, beta=0.8),
            eqxopt.Scale(-0.1),
        ),
        lambda: optax.chain(
            optax.ema(0.8),
            optax.ema(0.6, debias=False),
            optax.scale_by_optimistic_gradient(alpha=0.5, beta=0.8),
            optax.scale(-0.1),
        ),
        bad=((lambda: eqxopt.EMA(1.0), "decay"),),
    ),
    # ParamsEMA passes the updates through (the average itself is checked in
    # test_variants.py): the reference is Adam plus an EMA of the params.
    Case(
        "params_ema_adam",
        lambda: eqxopt.ParamsEMA(eqxopt.Adam(1e-2, b2=0.99), decay=0.9),
        lambda: _with_params_ema(optax.adam(1e-2, b2=0.99), 0.9),
        bad=(
            (lambda: eqxopt.ParamsEMA(eqxopt.SGD(0.1), decay=-0.1), "decay"),
            (lambda: eqxopt.ParamsEMA(optax.sgd(0.1)), "optimizer"),  # pyright: ignore
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
]
