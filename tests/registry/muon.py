"""Muon. Optax's `contrib.muon` is a parity reference only where the two agree by
design: without Nesterov (Optax bias-corrects the momentum; without Nesterov that is a
scalar factor that the Frobenius normalization removes, with Nesterov it changes the
look-ahead's weights), with Equinox's `(out, in)` layout passed to Optax as dimension
numbers (its default is Flax's `(in, out)`), and with Optax's Adam set up as our
default fallback (same `eps`, `weight_decay`, no Nesterov)."""

import jax
import optax
from optax.contrib import MuonDimensionNumbers as OptaxDims

import eqxopt

from ..helpers import Case


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


# Optax bias-corrects the momentum (factor c = 1/(1 - momentum^k)) before normalizing
# by (||c V|| + eps) where we normalize by (||V|| + eps): a relative difference of
# about eps/||V|| per update, far below float32 precision but visible in float64.
_RTOL64 = 1e-7

CASES = [
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
        rtol64=_RTOL64,
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
        rtol64=_RTOL64,
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
        rtol64=_RTOL64,
    ),
]

# Polar Express (no Optax counterpart: tests/test_kron_normuon.py checks it against
# modded-nanogpt's `polar_express`).
CASES.append(
    Case(
        "muon_polar_express",
        lambda: eqxopt.Muon(0.02, ns_coeffs=eqxopt.POLAR_EXPRESS_COEFFS),
        bad=(
            (lambda: eqxopt.Muon(0.02, ns_coeffs=((1.0, 2.0, 3.0),) * 4), "ns_coeffs"),
            (lambda: eqxopt.Muon(0.02, ns_steps=0), "ns_steps"),
            (lambda: eqxopt.Muon(0.02, momentum=1.0), "momentum"),
        ),
    )
)
