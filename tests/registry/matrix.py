"""Matrix-preconditioned optimizers (Muon, NorMuon, SOAP, Shampoo, Kron, GaLore).
Muon and GaLore are checked against Optax here; the others have no Optax counterpart
(`reference=None`): tests/test_matrix_*.py check them against NumPy transcriptions of
their references, and here they get the registry's property tests."""

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers as OptaxDims

import eqxopt

from ..helpers import Case, ndim2_mask


# Optax's float32 SVD of float64 gradients gives projections accurate to ~1e-7, which
# the base optimizer's normalisation carries into the updates.
_GALORE_RTOL64, _GALORE_ATOL64 = 1e-5, 1e-7


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


def _half_probability(count):
    return jnp.where(count < 2, 1.0, 0.5)


# Optax bias-corrects the momentum (factor c = 1/(1 - momentum^k)) before normalizing
# by (||c V|| + eps) where we normalize by (||V|| + eps): a relative difference of
# about eps/||V|| per update, far below float32 precision but visible in float64.
_MUON_RTOL64 = 1e-7


# Per-step coefficients (Dion's schedule, as in optax.contrib._muon).
DION = (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
)


def _optax_dims(batched: bool):
    """Optax dimension numbers for our (out, in) leaves: 2-D weights, and (with
    `batched`) 3-D leaves as a batch of (out, in) matrices; None routes to Adam."""

    def dims(params):
        def leaf(p):
            if p.ndim == 2:
                return OptaxDims(reduction_axis=1, output_axis=0)
            if batched and p.ndim == 3:
                return OptaxDims(reduction_axis=2, output_axis=1)
            return None

        return jax.tree.map(leaf, params)

    return dims


CASES = [
    Case(
        "galore",
        lambda: eqxopt.GaLore(1e-2, rank=2, update_proj_gap=3),
        lambda: optax.contrib.galore(1e-2, rank=2, update_proj_gap=3),
        rtol64=_GALORE_RTOL64,
        atol64=_GALORE_ATOL64,
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
            mask=ndim2_mask,
            weight_dimension_numbers=_OPTAX_DIMS,
        ),
        rtol64=_GALORE_RTOL64,
        atol64=_GALORE_ATOL64,
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
        rtol64=_GALORE_RTOL64,
        atol64=_GALORE_ATOL64,
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
    Case(
        "soap",
        lambda: eqxopt.SOAP(1e-2, precondition_frequency=2),
        bad=(
            (lambda: eqxopt.SOAP(-1e-3), "learning_rate"),
            (lambda: eqxopt.SOAP(b1=1.0), "b1"),
            (lambda: eqxopt.SOAP(b2=-0.1), "b2"),
            (lambda: eqxopt.SOAP(shampoo_beta=1.5), "shampoo_beta"),
            (lambda: eqxopt.SOAP(eps=-1.0), "eps"),
            (lambda: eqxopt.SOAP(precondition_frequency=0), "precondition_frequency"),
            (lambda: eqxopt.SOAP(precondition_frequency=2.5), "precondition_frequency"),
            (lambda: eqxopt.SOAP(max_precond_dim=0), "max_precond_dim"),
            (lambda: eqxopt.SOAP(precond_dtype=jnp.int32), "precond_dtype"),
        ),
    ),
    Case(
        # Every routing at once on the default tree: the (5, 3) weight has one factor
        # (5 > max_precond_dim), the vector is preconditioned (precondition_1d), the
        # 3-D leaf is merged to (6, 4) -> only its second axis, the scalar is Adam.
        "soap_1d_merge_normalize",
        lambda: eqxopt.SOAP(
            3e-3,
            b1=0.9,
            b2=0.99,
            shampoo_beta=0.9,
            weight_decay=0.0,
            precondition_frequency=3,
            max_precond_dim=4,
            merge_dims=True,
            precondition_1d=True,
            normalize_grads=True,
            correct_bias=False,
        ),
    ),
    Case(
        "shampoo",
        lambda: eqxopt.Shampoo(
            1e-2,
            block_size=3,
            start_preconditioning_step=1,
            best_effort_shape_interpretation=False,
        ),
        bad=(
            (lambda: eqxopt.Shampoo(-1e-3), "learning_rate"),
            (lambda: eqxopt.Shampoo(1e-3, block_size=0), "block_size"),
            (lambda: eqxopt.Shampoo(1e-3, b1=1.0), "b1"),
            (lambda: eqxopt.Shampoo(1e-3, b2=1.5), "b2"),
            (lambda: eqxopt.Shampoo(1e-3, matrix_epsilon=-1.0), "matrix_epsilon"),
            (lambda: eqxopt.Shampoo(1e-3, graft_type="adam"), "graft_type"),
            (
                lambda: eqxopt.Shampoo(1e-3, preconditioning_compute_steps=0),
                "preconditioning_compute_steps",
            ),
            (
                lambda: eqxopt.Shampoo(1e-3, preconditioner_type="output"),
                "preconditioner_type",
            ),
            (
                lambda: eqxopt.Shampoo(1e-3, inverse_failure_threshold=0.0),
                "inverse_failure_threshold",
            ),
        ),
    ),
    Case(
        # Default merging: every leaf of the default tree becomes one vector with a
        # single (n, n) factor, n up to 24 (96 on test_sharding's tree).
        "shampoo_rmsprop_normalized",
        lambda: eqxopt.Shampoo(
            1e-2,
            b2=0.9,
            graft_type="RMSPROP_NORMALIZED",
            preconditioning_compute_steps=2,
            statistics_compute_steps=2,
            weight_decay=1e-3,
            decoupled_weight_decay=True,
            nesterov=False,
            start_preconditioning_step=2,
        ),
    ),
    Case(
        "kron",
        lambda: eqxopt.Kron(1e-3, weight_decay=1e-4, key=1),
        bad=(
            (lambda: eqxopt.Kron(-1e-3), "learning_rate"),
            (lambda: eqxopt.Kron(1e-3, b1=1.0), "b1"),
            (lambda: eqxopt.Kron(1e-3, weight_decay=-1.0), "weight_decay"),
            (
                lambda: eqxopt.Kron(1e-3, preconditioner_update_probability=0.0),
                "preconditioner_update_probability",
            ),
            (lambda: eqxopt.Kron(1e-3, max_size_triangular=0), "max_size_triangular"),
            (lambda: eqxopt.Kron(1e-3, memory_save_mode="x"), "memory_save_mode"),
            (lambda: eqxopt.Kron(1e-3, preconditioner_lr=-0.1), "preconditioner_lr"),
            (lambda: eqxopt.Kron(1e-3, key=1.5), "key"),
        ),
    ),
    # Every routing: diagonal factors for oversized axes (> 2) and 1-D leaves, a
    # schedule below probability 1 (a counter), raw gradients into the fit, no
    # momentum buffer (b1=0). (`precond_dtype=jnp.float32` is tested in
    # tests/test_matrix_kron_normuon.py: the registry's dtype test allows only the
    # params' dtypes and `state_dtype` in the state.)
    Case(
        "kron_small_triangular",
        lambda: eqxopt.Kron(
            1e-2,
            b1=0.0,
            preconditioner_update_probability=_half_probability,
            max_size_triangular=2,
            memory_save_mode="one_diag",
            momentum_into_precond_update=False,
        ),
        bad=(
            (lambda: eqxopt.Kron(1e-3, min_ndim_triangular=-2), "min_ndim_triangular"),
            (lambda: eqxopt.Kron(1e-3, precond_dtype="int8"), "precond_dtype"),
        ),
    ),
    Case(
        "normuon",
        lambda: eqxopt.NorMuon(0.02, weight_decay=0.01),
        bad=(
            (lambda: eqxopt.NorMuon(-0.02), "learning_rate"),
            (lambda: eqxopt.NorMuon(0.02, beta2=1.0), "beta2"),
            (lambda: eqxopt.NorMuon(0.02, norm_eps=-1e-10), "norm_eps"),
            (lambda: eqxopt.NorMuon(0.02, momentum=1.0), "momentum"),
            (lambda: eqxopt.NorMuon(0.02, ns_steps=0), "ns_steps"),
            (lambda: eqxopt.NorMuon(0.02, scale_rule="x"), "scale_rule"),
        ),
    ),
    # Rank >= 2 leaves (the 3-D one as a batch of matrices), Polar Express, Moonlight
    # scale, no Nesterov.
    Case(
        "normuon_polar_express",
        lambda: eqxopt.NorMuon(
            0.01,
            nesterov=False,
            beta2=0.9,
            ns_coeffs=eqxopt.POLAR_EXPRESS_COEFFS,
            scale_rule="adamw_rms",
            matrix_mask=lambda p: p.ndim >= 2,
        ),
        bad=((lambda: eqxopt.NorMuon(0.02, ns_coeffs=(1.0, 2.0)), "ns_coeffs"),),
    ),
    Case("muon", lambda: eqxopt.Muon(0.02)),
    Case(
        "muon_no_nesterov",
        lambda: eqxopt.Muon(
            0.03, momentum=0.9, nesterov=False, eps=1e-8, weight_decay=0.05
        ),
        lambda: optax.contrib.muon(
            0.03,
            beta=0.9,
            eps=1e-8,
            weight_decay=0.05,
            nesterov=False,
            adam_weight_decay=0.05,
            muon_weight_dimension_numbers=_optax_dims(batched=False),
        ),
        # Five quintic Newton-Schulz iterations per step amplify the last-bit rounding
        # of the float32 matmuls (which the code generation changes): after ten steps
        # the weights agree to about 5e-6.
        rtol=2e-5,
        rtol64=_MUON_RTOL64,
    ),
    Case(
        "muon_adamw_rms",
        lambda: eqxopt.Muon(
            1e-2,
            momentum=0.8,
            nesterov=False,
            eps=1e-8,
            weight_decay=0.1,
            scale_rule="adamw_rms",
            matrix_mask=lambda p: p.ndim >= 2,
        ),
        lambda: optax.contrib.muon(
            1e-2,
            beta=0.8,
            eps=1e-8,
            weight_decay=0.1,
            nesterov=False,
            adam_weight_decay=0.1,
            consistent_rms=0.2,
            muon_weight_dimension_numbers=_optax_dims(batched=True),
        ),
        rtol64=_MUON_RTOL64,
    ),
    Case(
        "muon_per_step_coeffs",
        lambda: eqxopt.Muon(
            0.02,
            momentum=0.9,
            nesterov=False,
            ns_coeffs=DION,
            eps=1e-8,
            matrix_mask=lambda p: p.ndim >= 2,
        ),
        lambda: optax.contrib.muon(
            0.02,
            ns_coeffs=DION,
            beta=0.9,
            eps=1e-8,
            nesterov=False,
            muon_weight_dimension_numbers=_optax_dims(batched=True),
        ),
        rtol64=_MUON_RTOL64,
    ),
    # Polar Express (no Optax counterpart: tests/test_matrix_muon.py checks it against
    # modded-nanogpt's `polar_express`).
    Case(
        "muon_polar_express",
        lambda: eqxopt.Muon(0.02, ns_coeffs=eqxopt.POLAR_EXPRESS_COEFFS),
        bad=(
            (lambda: eqxopt.Muon(0.02, ns_coeffs=((1.0, 2.0, 3.0),) * 4), "ns_coeffs"),
            (lambda: eqxopt.Muon(0.02, ns_steps=0), "ns_steps"),
            (lambda: eqxopt.Muon(0.02, momentum=1.0), "momentum"),
        ),
    ),
]
