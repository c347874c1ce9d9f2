import jax
import optax

import eqxopt

from ..helpers import Case


# Optax evaluates schedules in float32 even under x64 (an int32 count divided by a
# Python int), eqxopt in float64: scheduled cases agree to float32 precision only.
SCHEDULE_RTOL64, SCHEDULE_ATOL64 = 1e-6, 1e-8

CASES = [
    Case(
        "sgd",
        lambda: eqxopt.SGD(0.1),
        lambda: optax.sgd(0.1),
        bad=(
            (lambda: eqxopt.SGD(-0.1), "learning_rate"),
            (lambda: eqxopt.SGD(0.1, momentum=1.0), "momentum"),
            (lambda: eqxopt.SGD(0.1, momentum=-0.5), "momentum"),
        ),
    ),
    Case(
        "sgd_momentum",
        lambda: eqxopt.SGD(0.1, momentum=0.9),
        lambda: optax.sgd(0.1, momentum=0.9),
    ),
    Case(
        "sgd_nesterov",
        lambda: eqxopt.SGD(0.05, momentum=0.8, nesterov=True),
        lambda: optax.sgd(0.05, momentum=0.8, nesterov=True),
    ),
    Case(
        "adam",
        lambda: eqxopt.Adam(1e-2),
        lambda: optax.adam(1e-2),
        bad=(
            (lambda: eqxopt.Adam(-1e-3), "learning_rate"),
            (lambda: eqxopt.Adam(1e-3, b1=1.0), "b1"),
            (lambda: eqxopt.Adam(1e-3, b2=-0.1), "b2"),
            (lambda: eqxopt.Adam(1e-3, eps=-1e-8), "eps"),
            (lambda: eqxopt.Adam(1e-3, eps_root=-1.0), "eps_root"),
        ),
    ),
    Case(
        "adam_nesterov",
        lambda: eqxopt.Adam(1e-2, b1=0.8, b2=0.99, eps=1e-6, nesterov=True),
        lambda: optax.adam(1e-2, b1=0.8, b2=0.99, eps=1e-6, nesterov=True),
    ),
    Case(
        "adam_eps_root",
        lambda: eqxopt.Adam(3e-3, eps=1e-4, eps_root=1e-6),
        lambda: optax.adam(3e-3, eps=1e-4, eps_root=1e-6),
    ),
    Case(
        "adamw",
        lambda: eqxopt.AdamW(1e-2, weight_decay=0.1),
        lambda: optax.adamw(1e-2, weight_decay=0.1),
        bad=(
            (lambda: eqxopt.AdamW(1e-3, weight_decay=-0.1), "weight_decay"),
            (lambda: eqxopt.AdamW(1e-3, b1=1.5), "b1"),
        ),
    ),
    Case(
        "adamw_mask",
        lambda: eqxopt.AdamW(1e-2, weight_decay=0.1, mask=lambda p: p.ndim > 1),
        lambda: optax.adamw(
            1e-2,
            weight_decay=0.1,
            mask=lambda params: jax.tree.map(lambda p: p.ndim > 1, params),
        ),
    ),
    Case(
        "adamw_mask_tree_nesterov",
        lambda: eqxopt.AdamW(
            1e-2,
            weight_decay=0.05,
            mask={
                "linear": {"weight": True, "bias": False},
                "conv": True,
                "scale": False,
            },
            nesterov=True,
        ),
        lambda: optax.adamw(
            1e-2,
            weight_decay=0.05,
            mask={
                "linear": {"weight": True, "bias": False},
                "conv": True,
                "scale": False,
            },
            nesterov=True,
        ),
    ),
    Case(
        "adam_cosine_schedule",
        lambda: eqxopt.Adam(eqxopt.schedules.WarmupCosineDecay(0.0, 1e-2, 3, 10)),
        lambda: optax.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 3, 10)),
        rtol64=SCHEDULE_RTOL64,
        atol64=SCHEDULE_ATOL64,
    ),
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
]
