"""Matrix-preconditioned optimizers: SOAP and Shampoo. Neither has an Optax
counterpart (`reference=None`); their numerics are checked against NumPy
transcriptions of the authors' implementations in `tests/test_soap_shampoo.py`. Here
they get the registry's property tests (dtypes, scan/cond, MultiSteps, sharding,
serialisation, interop)."""

import jax.numpy as jnp

import eqxopt

from ..helpers import Case


CASES = [
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
]
