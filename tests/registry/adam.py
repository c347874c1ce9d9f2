"""Adam and its relatives (AdamW, NAdam, AMSGrad, RAdam, AdaBelief, Adamax, Yogi, AdaN,
ADOPT, AdEMAMix, MARS, LAMB, Novograd, AcProp), each against its Optax counterpart
(MARS has none: tests/test_adam.py checks it against the authors' code)."""

import jax
import optax

import eqxopt

from ..helpers import Case, is_matrix, ndim2_mask


# Optax evaluates schedules in float32 even under x64 (an int32 count divided by a
# Python int), eqxopt in float64: scheduled cases agree to float32 precision only.
SCHEDULE_RTOL64, SCHEDULE_ATOL64 = 1e-6, 1e-8


# ACProp divides g by the root of the previous prediction-error EMA (eps = 1e-16), so
# coordinates where g is close to its EMA are ill-conditioned. In float32, ours uses
# 1 - b2 rounded from float32's b2 (as every Adam-family optimizer here) where Optax
# rounds the Python float 1 - b2: both are ~1e-5 off the float64 result on such
# coordinates (measured: ours 6e-6, Optax's 1.2e-5, apart 1.8e-5 at worst).
ACPROP_RTOL = 5e-5


# Optax evaluates its schedules in float32 even under x64 (eqxopt's follow the
# params' precision), so float64 parity of scheduled cases is limited to ~1e-7 in the
# learning rate, which scale-invariant steps (Fromage, Prodigy) amplify to ~1e-5.
SCHEDULE_RTOL64_AMPLIFIED = 1e-5


def _adopt_clip(count):
    return 0.5 + 0.25 * count


CASES = [
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
    # --- Adamax -----------------------------------------------------------------------
    Case(
        "adamax",
        lambda: eqxopt.Adamax(3e-3, b1=0.8, b2=0.95, eps=1e-6),
        lambda: optax.adamax(3e-3, b1=0.8, b2=0.95, eps=1e-6),
        bad=(
            (lambda: eqxopt.Adamax(-1e-3), "learning_rate"),
            (lambda: eqxopt.Adamax(1e-3, b2=1.0), "b2"),
        ),
    ),
    Case(
        "adamaxw",
        lambda: eqxopt.AdamaxW(
            3e-3, b1=0.85, b2=0.99, eps=1e-7, weight_decay=0.1, mask=is_matrix
        ),
        lambda: optax.adamaxw(
            3e-3, b1=0.85, b2=0.99, eps=1e-7, weight_decay=0.1, mask=ndim2_mask
        ),
        bad=((lambda: eqxopt.AdamaxW(1e-3, weight_decay=-1.0), "weight_decay"),),
    ),
    # --- AMSGrad ----------------------------------------------------------------------
    Case(
        "amsgrad",
        lambda: eqxopt.AMSGrad(3e-3, b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-8),
        lambda: optax.amsgrad(3e-3, b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-8),
        bad=(
            (lambda: eqxopt.AMSGrad(1e-3, b1=-0.1), "b1"),
            (lambda: eqxopt.AMSGrad(1e-3, eps_root=-1.0), "eps_root"),
        ),
    ),
    Case(
        "chain_scale_by_amsgrad_paper",
        lambda: eqxopt.Chain(
            eqxopt.ScaleByAmsgrad(
                0.85, 0.9, 1e-5, bias_correction_mu=False, bias_correction_nu=False
            ),
            eqxopt.ScaleByLearningRate(1e-2),
        ),
        lambda: optax.chain(
            optax.scale_by_amsgrad(
                0.85, 0.9, 1e-5, bias_correction_mu=False, bias_correction_nu=False
            ),
            optax.scale_by_learning_rate(1e-2),
        ),
        bad=((lambda: eqxopt.ScaleByAmsgrad(b2=1.5), "b2"),),
    ),
    # --- NAdam ------------------------------------------------------------------------
    Case(
        "nadam",
        lambda: eqxopt.NAdam(3e-3, b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-9),
        lambda: optax.nadam(3e-3, b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-9),
        bad=((lambda: eqxopt.NAdam(1e-3, b1=1.0), "b1"),),
    ),
    Case(
        "nadamw",
        lambda: eqxopt.NAdamW(
            3e-3, b1=0.85, b2=0.99, eps=1e-7, weight_decay=0.1, mask=is_matrix
        ),
        lambda: optax.nadamw(
            3e-3, b1=0.85, b2=0.99, eps=1e-7, weight_decay=0.1, mask=ndim2_mask
        ),
        bad=((lambda: eqxopt.NAdamW(1e-3, weight_decay=-0.1), "weight_decay"),),
    ),
    # --- RAdam (b2=0.9, threshold 4: rectification starts at step 5 of 10) -----------
    Case(
        "radam",
        lambda: eqxopt.RAdam(3e-3, b1=0.8, b2=0.9, eps=1e-6, threshold=4.0),
        lambda: optax.radam(3e-3, b1=0.8, b2=0.9, eps=1e-6, threshold=4.0),
        bad=((lambda: eqxopt.RAdam(1e-3, eps=-1.0), "eps"),),
    ),
    Case(
        "chain_scale_by_radam_nesterov",
        lambda: eqxopt.Chain(
            eqxopt.ScaleByRadam(0.85, 0.9, 1e-7, 1e-9, 4.5, nesterov=True),
            eqxopt.ScaleByLearningRate(1e-2),
        ),
        lambda: optax.chain(
            optax.scale_by_radam(0.85, 0.9, 1e-7, 1e-9, 4.5, nesterov=True),
            optax.scale_by_learning_rate(1e-2),
        ),
        bad=((lambda: eqxopt.ScaleByRadam(b2=1.0), "b2"),),
    ),
    # --- AdaBelief --------------------------------------------------------------------
    Case(
        "adabelief",
        lambda: eqxopt.AdaBelief(3e-3, b1=0.8, b2=0.95, eps=1e-8, eps_root=1e-10),
        lambda: optax.adabelief(3e-3, b1=0.8, b2=0.95, eps=1e-8, eps_root=1e-10),
        bad=((lambda: eqxopt.AdaBelief(1e-3, eps_root=-1.0), "eps_root"),),
    ),
    Case(
        "chain_scale_by_belief_nesterov",
        lambda: eqxopt.Chain(
            eqxopt.ScaleByBelief(0.85, 0.99, 1e-7, 1e-9, nesterov=True),
            eqxopt.ScaleByLearningRate(1e-2),
        ),
        lambda: optax.chain(
            optax.scale_by_belief(0.85, 0.99, 1e-7, 1e-9, nesterov=True),
            optax.scale_by_learning_rate(1e-2),
        ),
        bad=((lambda: eqxopt.ScaleByBelief(b1=1.0), "b1"),),
    ),
    # --- Yogi -------------------------------------------------------------------------
    Case(
        "yogi",
        lambda: eqxopt.Yogi(3e-2, b1=0.8, b2=0.95, eps=1e-4),
        lambda: optax.yogi(3e-2, b1=0.8, b2=0.95, eps=1e-4),
        bad=((lambda: eqxopt.Yogi(1e-3, eps=-1.0), "eps"),),
    ),
    Case(
        "chain_scale_by_yogi",
        lambda: eqxopt.Chain(
            eqxopt.ScaleByYogi(0.85, 0.9, 1e-3, 1e-8, initial_accumulator_value=0.1),
            eqxopt.ScaleByLearningRate(1e-2),
        ),
        lambda: optax.chain(
            optax.scale_by_yogi(0.85, 0.9, 1e-3, 1e-8, initial_accumulator_value=0.1),
            optax.scale_by_learning_rate(1e-2),
        ),
        bad=(
            (
                lambda: eqxopt.ScaleByYogi(initial_accumulator_value=-1.0),
                "initial_accumulator_value",
            ),
        ),
    ),
    # --- Lamb, Lars, ScaleByTrustRatio ------------------------------------------------
    Case(
        "lamb",
        lambda: eqxopt.Lamb(
            1e-2, b1=0.8, b2=0.95, eps=1e-7, weight_decay=0.1, mask=is_matrix
        ),
        lambda: optax.lamb(
            1e-2, b1=0.8, b2=0.95, eps=1e-7, weight_decay=0.1, mask=ndim2_mask
        ),
        bad=(
            (lambda: eqxopt.Lamb(1e-3, b2=1.0), "b2"),
            (lambda: eqxopt.Lamb(1e-3, weight_decay=-1.0), "weight_decay"),
        ),
    ),
    # --- Novograd ---------------------------------------------------------------------
    Case(
        "novograd",
        lambda: eqxopt.Novograd(
            1e-2, b1=0.8, b2=0.5, eps=1e-7, eps_root=1e-9, weight_decay=0.01
        ),
        lambda: optax.novograd(
            1e-2, b1=0.8, b2=0.5, eps=1e-7, eps_root=1e-9, weight_decay=0.01
        ),
        bad=(
            (lambda: eqxopt.Novograd(1e-2, b2=1.0), "b2"),
            (lambda: eqxopt.Novograd(1e-2, weight_decay=-1.0), "weight_decay"),
        ),
    ),
    Case(
        "chain_scale_by_novograd",
        lambda: eqxopt.Chain(
            eqxopt.ScaleByNovograd(0.85, 0.4, 1e-6),
            eqxopt.ScaleByLearningRate(eqxopt.schedules.CosineDecay(1e-2, 12, 0.3)),
        ),
        lambda: optax.chain(
            optax.scale_by_novograd(0.85, 0.4, 1e-6),
            optax.scale_by_learning_rate(optax.cosine_decay_schedule(1e-2, 12, 0.3)),
        ),
        bad=((lambda: eqxopt.ScaleByNovograd(eps=-1.0), "eps"),),
    ),
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
            mask=ndim2_mask,
        ),
        rtol=ACPROP_RTOL,
        rtol64=SCHEDULE_RTOL64_AMPLIFIED,
        bad=((lambda: eqxopt.AcProp(1e-2, weight_decay=-0.1), "weight_decay"),),
        optax_fn="contrib.acprop",
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
            mask=ndim2_mask,
        ),
        rtol64=SCHEDULE_RTOL64_AMPLIFIED,
        optax_fn="contrib.simplified_ademamix",
    ),
    # --- MARS (reference: the authors' code in NumPy, tests/test_adam.py) ----------
    Case(
        "mars",
        lambda: eqxopt.MARS(3e-3, weight_decay=0.1),
        bad=(
            (lambda: eqxopt.MARS(-1.0), "learning_rate"),
            (lambda: eqxopt.MARS(1e-3, b1=1.0), "b1"),
            (lambda: eqxopt.MARS(1e-3, b2=1.5), "b2"),
            (lambda: eqxopt.MARS(1e-3, gamma=-0.1), "gamma"),
            (lambda: eqxopt.MARS(1e-3, eps=-1.0), "eps"),
            (lambda: eqxopt.MARS(1e-3, weight_decay=-1.0), "weight_decay"),
            (lambda: eqxopt.MARS(1e-3, lr_1d=-1.0), "lr_1d"),
            (lambda: eqxopt.MARS(1e-3, b1_1d=1.0), "b1_1d"),
            (lambda: eqxopt.MARS(1e-3, b2_1d=-0.5), "b2_1d"),
            (lambda: eqxopt.MARS(1e-3, weight_decay_1d=-1.0), "weight_decay_1d"),
        ),
    ),
    Case("mars_optimize_1d", lambda: eqxopt.MARS(1e-2, optimize_1d=True)),
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
            mask=ndim2_mask,
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
        rtol64=SCHEDULE_RTOL64_AMPLIFIED,
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
            mask=ndim2_mask,
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
]
