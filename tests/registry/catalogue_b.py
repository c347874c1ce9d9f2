"""The second half of the catalogue: Adadelta, sign methods, Fromage, gradient noise,
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

    def update(grads, state, params=None, **extra):
        inner, slow = state
        pair = optax.LookaheadParams(fast=params, slow=slow)
        updates, inner = lookahead.update(grads, inner, pair)
        return updates.fast, (inner, optax.apply_updates(slow, updates.slow))

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

    def update(grads, state, params=None, **extra):
        inner, ema, count = state
        updates, inner = tx.update(grads, inner, params)
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
    ),
    # --- sign methods ----------------------------------------------------------------
    Case("sign_sgd", lambda: eqxopt.SignSGD(0.03), lambda: optax.sign_sgd(0.03)),
    Case(
        "signum",
        lambda: eqxopt.Signum(0.02, beta=0.8),
        lambda: optax.signum(0.02, beta=0.8),
    ),
    # --- Fromage ---------------------------------------------------------------------
    Case(
        "fromage",
        lambda: eqxopt.Fromage(0.05, min_norm=1e-4),
        lambda: optax.fromage(0.05, min_norm=1e-4),
    ),
    # --- gradient noise (same key usage as Optax: parity holds exactly) -------------
    Case(
        "noisy_sgd",
        lambda: eqxopt.NoisySGD(0.05, eta=0.02, gamma=0.6, key=3),
        lambda: optax.noisy_sgd(0.05, eta=0.02, gamma=0.6, key=3),
    ),
    Case(
        "add_noise",
        lambda: eqxopt.AddNoise(0.05, 0.5, key=7),
        lambda: optax.add_noise(0.05, 0.5, key=7),
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
    ),
    # --- SM3 -------------------------------------------------------------------------
    Case(
        "sm3",
        lambda: eqxopt.SM3(0.1, momentum=0.8),
        lambda: optax.sm3(0.1, momentum=0.8),
        shapes=NO_SCALAR,
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
    ),
    # --- Rprop, optimistic methods ---------------------------------------------------
    Case(
        "rprop",
        lambda: eqxopt.Rprop(
            0.02, eta_minus=0.4, eta_plus=1.5, min_step_size=1e-3, max_step_size=0.05
        ),
        # No Optax reference: optax 0.2.8's `scale_by_rprop` emits the previous step's
        # update (one step stale, zero at first; optax PR #1725). eqxopt follows the
        # paper and torch.optim.Rprop, checked in NumPy in test_catalogue_b.py.
        None,
    ),
    Case(
        "optimistic_gradient_descent",
        lambda: eqxopt.OptimisticGradientDescent(0.05, alpha=0.7, beta=0.4),
        lambda: optax.optimistic_gradient_descent(0.05, alpha=0.7, beta=0.4),
    ),
    Case(
        "optimistic_adam",
        lambda: eqxopt.OptimisticAdam(
            1e-2, alpha=0.8, beta=0.6, b1=0.85, b2=0.99, eps=1e-6
        ),
        lambda: optax.optimistic_adam_v2(
            1e-2, alpha=0.8, beta=0.6, b1=0.85, b2=0.99, eps=1e-6
        ),
    ),
    # --- Lookahead -------------------------------------------------------------------
    Case(
        "lookahead_adam",
        lambda: eqxopt.Lookahead(
            eqxopt.Adam(1e-2, b1=0.8), sync_period=3, slow_step_size=0.6
        ),
        lambda: _fast_only(optax.lookahead(optax.adam(1e-2, b1=0.8), 3, 0.6)),
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
    ),
    # ParamsEMA passes the updates through (the average itself is checked in
    # test_catalogue_b.py): the reference is Adam plus an EMA of the params.
    Case(
        "params_ema_adam",
        lambda: eqxopt.ParamsEMA(eqxopt.Adam(1e-2, b2=0.99), decay=0.9),
        lambda: _with_params_ema(optax.adam(1e-2, b2=0.99), 0.9),
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
    ),
]
