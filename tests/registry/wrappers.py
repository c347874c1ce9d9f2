"""Wrappers around other optimizers (Chain-free composition: MultiSteps, Masked,
Partition, ApplyIfFinite, Lookahead, EMA, Cautious, schedule-free, SAM,
SplitRealAndImaginary), each against its Optax counterpart where Optax has one."""

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import optax

import eqxopt

from ..helpers import Case


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


def _grad_at(params, i):
    del i
    return jax.grad(_loss)(params)


def _grad_fn(params):
    return {"grad_fn": jtu.Partial(_grad_at)}


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


def _every_k_optax(count):
    # Optax needs an integer window length (a float one turns its counter into a
    # float); ours rounds `PiecewiseConstant`'s float values.
    return jnp.where(count < 2, 2, 3).astype(jnp.int32)


def _optax_multisteps(inner, every_k, **kwargs):
    """`optax.MultiSteps` with its accumulator in the params' dtype (ours' default).

    Optax's own default is float32, and its `accumulator_dtype=None` turns a float32
    accumulator into float64 under x64 (`(1 - emit) * acc` promotes via int64).
    """
    built = {}

    def init(params):
        dtype = jtu.tree_leaves(params)[0].dtype
        built["tx"] = optax.MultiSteps(
            inner, every_k, accumulator_dtype=dtype, **kwargs
        ).gradient_transformation()
        return built["tx"].init(params)

    def update(updates, state, params=None, **extra):
        return built["tx"].update(updates, state, params, **extra)

    return optax.GradientTransformationExtraArgs(init, update)


_MASK = {"linear": {"weight": True, "bias": False}, "conv": True, "scale": False}


_LABELS = {"linear": "a", "conv": "b", "scale": "b"}


def _ndim_labels(params):
    return jax.tree.map(lambda p: "adam" if p.ndim >= 2 else "sgd", params)


CASES = [
    # --- SplitRealAndImaginary (real params pass through; complex ones are tested in
    # tests/test_wrappers.py) --------------------------------------------------------
    Case(
        "split_real_and_imaginary_adam",
        lambda: eqxopt.SplitRealAndImaginary(eqxopt.Adam(1e-2)),
        lambda: optax.contrib.split_real_and_imaginary(optax.adam(1e-2)),
        bad=((lambda: eqxopt.SplitRealAndImaginary(optax.adam(1e-2)), "inner"),),  # pyright: ignore
        optax_fn="contrib.split_real_and_imaginary",
    ),
    # --- SAM ----------------------------------------------------------------------
    Case(
        "sam",
        lambda: eqxopt.SAM(
            eqxopt.SGD(0.1, momentum=0.9), eqxopt.SGD(0.05), sync_period=3
        ),
        lambda: optax.contrib.sam(
            optax.sgd(0.1, momentum=0.9), optax.sgd(0.05), sync_period=3
        ),
        optax_fn="contrib.sam",
        bad=(
            (lambda: eqxopt.SAM(eqxopt.SGD(0.1), eqxopt.SGD(0.1), 0), "sync_period"),
            (lambda: eqxopt.SAM(optax.sgd(0.1), eqxopt.SGD(0.1)), "optimizer"),  # pyright: ignore
            (lambda: eqxopt.SAM(eqxopt.SGD(0.1), optax.sgd(0.1)), "adv_optimizer"),  # pyright: ignore
        ),
    ),
    Case(
        "sam_paper",  # the drop-in SAM of the paper: normalised ascent, then SGD
        lambda: eqxopt.SAM(
            eqxopt.SGD(0.1), eqxopt.Chain(eqxopt.Normalize(), eqxopt.SGD(0.05))
        ),
        lambda: optax.contrib.sam(
            optax.sgd(0.1), optax.chain(optax.contrib.normalize(), optax.sgd(0.05))
        ),
    ),
    Case(
        "sam_keep_adv_state",
        lambda: eqxopt.SAM(
            eqxopt.Adam(0.02), eqxopt.SGD(0.05, momentum=0.5), reset_state=False
        ),
        lambda: optax.contrib.sam(
            optax.adam(0.02), optax.sgd(0.05, momentum=0.5), reset_state=False
        ),
    ),
    Case(
        "sam_opaque",
        lambda: eqxopt.SAM(
            eqxopt.Adam(0.02), eqxopt.SGD(0.05), sync_period=3, opaque_mode=True
        ),
        lambda: optax.contrib.sam(
            optax.adam(0.02), optax.sgd(0.05), sync_period=3, opaque_mode=True
        ),
        loss=_loss,
        extra=_grad_fn,
        # float32: eqxopt's Adam rounds differently from Optax's by an ulp, and each
        # update evaluates the cubic gradient of `_loss` at two points, so ten steps
        # drift apart by ~2e-7 (float64 parity holds at the default 1e-10).
        atol=1e-6,
    ),
    Case(
        "cautious_adam",
        lambda: eqxopt.Cautious(eqxopt.Adam(1e-2)),
        bad=((lambda: eqxopt.Cautious(optax.adam(1e-2)), "optimizer"),),  # pyright: ignore
    ),
    Case(
        "schedule_free_sgd",
        lambda: eqxopt.ScheduleFreeSGD(
            0.5, b1=0.8, weight_decay=1e-2, weight_lr_power=1.5
        ),
        lambda: optax.contrib.schedule_free_sgd(
            0.5, b1=0.8, weight_decay=1e-2, weight_lr_power=1.5
        ),
        rtol=1e-5,
        atol=1e-6,
        steps=20,
    ),
    Case(
        "schedule_free_adamw",
        lambda: eqxopt.ScheduleFreeAdamW(
            1e-2, b1=0.85, b2=0.99, eps=1e-6, weight_decay=0.05, weight_lr_power=1.0
        ),
        lambda: optax.contrib.schedule_free_adamw(
            1e-2, b1=0.85, b2=0.99, eps=1e-6, weight_decay=0.05, weight_lr_power=1.0
        ),
        rtol=1e-5,
        atol=1e-6,
        steps=20,
    ),
    Case(
        "schedule_free_wrap_sgd",
        lambda: eqxopt.ScheduleFree(eqxopt.SGD(0.3), 0.3, b1=0.7, weight_lr_power=3.0),
        lambda: optax.contrib.schedule_free(
            optax.sgd(0.3), 0.3, b1=0.7, weight_lr_power=3.0
        ),
        rtol=1e-5,
        atol=1e-6,
        steps=20,
    ),
    Case(
        "schedule_free_wrap_adam",
        lambda: eqxopt.ScheduleFree(
            eqxopt.Adam(1e-2, b1=0.0, b2=0.98), 1e-2, b1=0.95, weight_lr_power=2.5
        ),
        lambda: optax.contrib.schedule_free(
            optax.adam(1e-2, b1=0.0, b2=0.98), 1e-2, b1=0.95, weight_lr_power=2.5
        ),
        rtol=1e-5,
        atol=1e-6,
        steps=20,
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
    # test_wrappers.py): the reference is Adam plus an EMA of the params.
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
        "multisteps3_adam",
        lambda: eqxopt.MultiSteps(eqxopt.Adam(1e-2, b1=0.8, b2=0.99), 3),
        lambda: _optax_multisteps(optax.adam(1e-2, b1=0.8, b2=0.99), 3),
    ),
    Case(
        "multisteps_sum_schedule_sgd",
        lambda: eqxopt.MultiSteps(
            eqxopt.SGD(0.05, momentum=0.5),
            every_k=eqxopt.schedules.PiecewiseConstant(2.0, {2: 1.5}),
            use_mean=False,
        ),
        lambda: _optax_multisteps(
            optax.sgd(0.05, momentum=0.5), _every_k_optax, use_grad_mean=False
        ),
        steps=12,
    ),
    Case(
        "multisteps2_chain_zero_nans_adam",
        lambda: eqxopt.MultiSteps(
            eqxopt.Chain(eqxopt.ZeroNans(), eqxopt.Adam(3e-2, eps=1e-6)), 2
        ),
        lambda: _optax_multisteps(
            optax.chain(optax.zero_nans(), optax.adam(3e-2, eps=1e-6)), 2
        ),
    ),
    Case(
        "masked_adam",
        lambda: eqxopt.Masked(eqxopt.Adam(1e-2, b1=0.85), _MASK),
        lambda: optax.masked(optax.adam(1e-2, b1=0.85), _MASK),
    ),
    Case(
        "masked_callable_sgd",
        lambda: eqxopt.Masked(eqxopt.SGD(0.05, momentum=0.9), lambda p: p.ndim >= 2),
        lambda: optax.masked(
            optax.sgd(0.05, momentum=0.9),
            lambda ps: jax.tree.map(lambda p: p.ndim >= 2, ps),
        ),
    ),
    Case(
        "partition_adam_sgd",
        lambda: eqxopt.Partition(
            {"adam": eqxopt.Adam(1e-2, b2=0.99), "sgd": eqxopt.SGD(0.05, momentum=0.8)},
            lambda p: "adam" if p.ndim >= 2 else "sgd",
        ),
        lambda: optax.partition(
            {"adam": optax.adam(1e-2, b2=0.99), "sgd": optax.sgd(0.05, momentum=0.8)},
            _ndim_labels,
        ),
    ),
    Case(
        "partition_tree_labels",
        lambda: eqxopt.Partition(
            {
                "a": eqxopt.Adam(eqxopt.schedules.CosineDecay(1e-2, 8)),
                "b": eqxopt.Chain(
                    eqxopt.ClipByGlobalNorm(0.5), eqxopt.SGD(0.1, momentum=0.7)
                ),
            },
            _LABELS,
        ),
        lambda: optax.partition(
            {
                "a": optax.adam(optax.cosine_decay_schedule(1e-2, 8)),
                "b": optax.chain(
                    optax.clip_by_global_norm(0.5), optax.sgd(0.1, momentum=0.7)
                ),
            },
            _LABELS,
        ),
    ),
    Case(
        "apply_if_finite_adam",
        lambda: eqxopt.ApplyIfFinite(eqxopt.Adam(1e-2, eps=1e-6), 2),
        lambda: optax.apply_if_finite(optax.adam(1e-2, eps=1e-6), 2),
    ),
]
