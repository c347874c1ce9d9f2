"""GaLore (`optax.contrib.galore`, `optax.contrib.scale_by_galore`): Adam (or another
gradient transformation) on low-rank projections of the matrix gradients.

The registry's params have a (5, 3) matrix, a (5,) vector, a (2, 3, 4) tensor and a
scalar. With `rank=2` the projection really drops a dimension, and with a small
`update_proj_gap` the ten parity steps cross several SVD refreshes (the base
optimizer's moments then carry over from the previous basis, as in Optax).

Optax computes the SVD in float32 whatever the params' dtype; eqxopt computes it in
the leaf's compute dtype (float64 for float64 params). The float64 tolerances are
therefore float32's SVD accuracy, not float64 round-off (see `_RTOL64`).
"""

import jax
import optax

import eqxopt

from ..helpers import Case


# Optax's float32 SVD of float64 gradients gives projections accurate to ~1e-7, which
# the base optimizer's normalisation carries into the updates.
_RTOL64, _ATOL64 = 1e-5, 1e-7


def _ndim2(params):
    return jax.tree.map(lambda p: p.ndim > 1, params)


# The (2, 3, 4) tensor as an (8, 3) matrix: axes 0 and 2 reduce, axis 1 is the output.
_DIMS = {
    "linear": {"weight": eqxopt.GaLoreDimensionNumbers(), "bias": None},
    "conv": eqxopt.GaLoreDimensionNumbers(reduction_axis=(0, 2), output_axis=1),
    "scale": None,
}
_OPTAX_DIMS = {
    "linear": {"weight": optax.contrib.GaLoreDimensionNumbers(), "bias": None},
    "conv": optax.contrib.GaLoreDimensionNumbers(reduction_axis=(0, 2), output_axis=1),
    "scale": None,
}


CASES = [
    Case(
        "galore",
        lambda: eqxopt.GaLore(1e-2, rank=2, update_proj_gap=3),
        lambda: optax.contrib.galore(1e-2, rank=2, update_proj_gap=3),
        rtol64=_RTOL64,
        atol64=_ATOL64,
        optax_fn="contrib.galore",
        bad=(
            (lambda: eqxopt.GaLore(-1.0), "learning_rate"),
            (lambda: eqxopt.GaLore(1e-2, rank=0), "rank"),
            (lambda: eqxopt.GaLore(1e-2, rank=2.5), "rank"),  # pyright: ignore
            (lambda: eqxopt.GaLore(1e-2, update_proj_gap=0), "update_proj_gap"),
            (lambda: eqxopt.GaLore(1e-2, update_proj_gap=1.5), "update_proj_gap"),
            (lambda: eqxopt.GaLore(1e-2, weight_decay=-0.1), "weight_decay"),
            (
                lambda: eqxopt.GaLore(1e-2, base_optimizer=optax.adam(1.0)),  # pyright: ignore
                "base_optimizer",
            ),
        ),
    ),
    Case(
        "galore_dims_decay_schedule",
        lambda: eqxopt.GaLore(
            eqxopt.schedules.ExponentialDecay(2e-2, 3, 0.5),
            rank=2,
            update_proj_gap=4,
            scale=0.5,
            base_optimizer=eqxopt.ScaleByAdam(b1=0.8, b2=0.95, eps=1e-6),
            weight_decay=0.1,
            mask=lambda p: p.ndim > 1,
            weight_dimension_numbers=_DIMS,
        ),
        lambda: optax.contrib.galore(
            optax.exponential_decay(2e-2, 3, 0.5),
            rank=2,
            update_proj_gap=4,
            scale=0.5,
            base_optimizer=optax.scale_by_adam(b1=0.8, b2=0.95, eps=1e-6),
            weight_decay=0.1,
            mask=_ndim2,
            weight_dimension_numbers=_OPTAX_DIMS,
        ),
        rtol64=_RTOL64,
        atol64=_ATOL64,
    ),
    Case(
        "scale_by_galore",
        lambda: eqxopt.ScaleByGaLore(
            rank=1,
            update_proj_gap=2,
            scale=0.25,
            base_optimizer=eqxopt.ScaleByLion(b1=0.9, b2=0.99),
        ),
        lambda: optax.contrib.scale_by_galore(
            rank=1,
            update_proj_gap=2,
            scale=0.25,
            base_optimizer=optax.scale_by_lion(b1=0.9, b2=0.99),
        ),
        rtol64=_RTOL64,
        atol64=_ATOL64,
        optax_fn="contrib.scale_by_galore",
        bad=(
            (lambda: eqxopt.ScaleByGaLore(rank=-1), "rank"),
            (lambda: eqxopt.ScaleByGaLore(update_proj_gap=-2), "update_proj_gap"),
            (
                lambda: eqxopt.ScaleByGaLore(base_optimizer=lambda g: g),  # pyright: ignore
                "base_optimizer",
            ),
        ),
    ),
]
