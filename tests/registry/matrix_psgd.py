"""Kron (PSGD) and NorMuon. Neither has an Optax counterpart (`reference=None`):
tests/test_kron_normuon.py checks them step by step against NumPy transcriptions of
their references (psgd-jax 0.2.9's `kron`, zichongli5/NorMuon's `normuon_update`).
Here they get the registry's dtype, scan, cond, MultiSteps, sharding, serialisation
and construction tests."""

import jax.numpy as jnp

import eqxopt

from ..helpers import Case


def _half_probability(count):
    return jnp.where(count < 2, 1.0, 0.5)


CASES = [
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
    # tests/test_kron_normuon.py: the registry's dtype test allows only the params'
    # dtypes and `state_dtype` in the state.)
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
]
