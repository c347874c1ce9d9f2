"""The adaptive family: Lion, RMSProp, Adagrad, Adafactor, the Adam family
(Adamax, AMSGrad, NAdam, RAdam, AdaBelief, Yogi), Lamb, Lars, Novograd, and their
`ScaleBy*` building blocks. Every case sets non-default hyperparameters on both
sides."""

import jax
import jax.numpy as jnp
import optax

import eqxopt

from ..helpers import Case


def _ndim2(params):
    return jax.tree.map(lambda p: p.ndim > 1, params)


def _is_matrix(p):
    return p.ndim > 1


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


CASES = [
    # --- Lion -------------------------------------------------------------------------
    Case(
        "lion",
        lambda: eqxopt.Lion(3e-3, b1=0.8, b2=0.95, weight_decay=0.1, mask=_is_matrix),
        lambda: optax.lion(3e-3, b1=0.8, b2=0.95, weight_decay=0.1, mask=_ndim2),
        bad=(
            (lambda: eqxopt.Lion(-1e-3), "learning_rate"),
            (lambda: eqxopt.Lion(1e-3, b1=1.5), "b1"),
            (lambda: eqxopt.Lion(1e-3, b2=1.0), "b2"),
            (lambda: eqxopt.Lion(1e-3, weight_decay=-1.0), "weight_decay"),
        ),
    ),
    Case(
        "chain_scale_by_lion_smooth",
        lambda: eqxopt.Chain(
            eqxopt.ScaleByLion(0.85, 0.9, mode="smooth", smooth_beta=2.0),
            eqxopt.ScaleByLearningRate(eqxopt.schedules.CosineDecay(1e-2, 8, 0.1)),
        ),
        lambda: optax.chain(
            optax.scale_by_lion(0.85, 0.9, mode="smooth", smooth_beta=2.0),
            optax.scale_by_learning_rate(optax.cosine_decay_schedule(1e-2, 8, 0.1)),
        ),
        bad=(
            (lambda: eqxopt.ScaleByLearningRate(-1.0), "learning_rate"),
            (lambda: eqxopt.ScaleByLion(mode="soft"), "mode"),
        ),
    ),
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
            weight_decay_mask=_is_matrix,
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
            weight_decay_mask=_ndim2,
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
            3e-3, b1=0.85, b2=0.99, eps=1e-7, weight_decay=0.1, mask=_is_matrix
        ),
        lambda: optax.adamaxw(
            3e-3, b1=0.85, b2=0.99, eps=1e-7, weight_decay=0.1, mask=_ndim2
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
            3e-3, b1=0.85, b2=0.99, eps=1e-7, weight_decay=0.1, mask=_is_matrix
        ),
        lambda: optax.nadamw(
            3e-3, b1=0.85, b2=0.99, eps=1e-7, weight_decay=0.1, mask=_ndim2
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
            1e-2, b1=0.8, b2=0.95, eps=1e-7, weight_decay=0.1, mask=_is_matrix
        ),
        lambda: optax.lamb(
            1e-2, b1=0.8, b2=0.95, eps=1e-7, weight_decay=0.1, mask=_ndim2
        ),
        bad=(
            (lambda: eqxopt.Lamb(1e-3, b2=1.0), "b2"),
            (lambda: eqxopt.Lamb(1e-3, weight_decay=-1.0), "weight_decay"),
        ),
    ),
    Case(
        "lars",
        lambda: eqxopt.Lars(
            0.5,
            weight_decay=0.01,
            weight_decay_mask=_is_matrix,
            trust_coefficient=0.01,
            eps=1e-6,
            trust_ratio_mask={
                "linear": {"weight": True, "bias": False},
                "conv": True,
                "scale": False,
            },
            momentum=0.8,
            nesterov=True,
        ),
        lambda: optax.lars(
            0.5,
            weight_decay=0.01,
            weight_decay_mask=_ndim2,
            trust_coefficient=0.01,
            eps=1e-6,
            trust_ratio_mask={
                "linear": {"weight": True, "bias": False},
                "conv": True,
                "scale": False,
            },
            momentum=0.8,
            nesterov=True,
        ),
        bad=(
            (lambda: eqxopt.Lars(0.1, trust_coefficient=-1.0), "trust_coefficient"),
            (lambda: eqxopt.Lars(0.1, momentum=1.0), "momentum"),
            (lambda: eqxopt.Lars(0.1, eps=-1.0), "eps"),
        ),
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
]
