"""Optax's contrib catalogue, part 2: DPSGD and DifferentiallyPrivateAggregate,
ReduceOnPlateau, SAM, Sophia (with Hutchinson's estimator); and two newer methods,
MARS and Cautious (no Optax reference: tests/test_contrib_b.py checks them against
NumPy transcriptions of the authors' code)."""

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import optax

import eqxopt
from eqxopt._misc import tree_map

from ..helpers import Case


def _ndim2(params):
    return jax.tree.map(lambda p: p.ndim > 1, params)


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


def _value(params):
    return {"value": _loss(params)}


def _grad_at(params, i):
    del i
    return jax.grad(_loss)(params)


def _grad_fn(params):
    return {"grad_fn": jtu.Partial(_grad_at)}


def _obj_fn(params):
    return {"obj_fn": jtu.Partial(_loss)}


# --- per-example gradients ---------------------------------------------------------
# The registry feeds param-shaped gradients; DP aggregation wants a batch axis first.
# These two transforms (one eqxopt, one Optax, the same arithmetic) turn `g` into a
# batch of four examples with different norms, so some are clipped and some not.


def _examples(g):
    return jnp.stack([g, -0.5 * g, 2 * g, 0.1 * g])


class _PerExample(eqxopt.AbstractOptimizer):
    def init(self, params):
        return eqxopt.EmptyState()

    def update(self, grads, state, params=None, **extra):
        return tree_map(_examples, grads), state


def _per_example_optax():
    return optax.GradientTransformation(
        lambda params: optax.EmptyState(),
        lambda updates, state, params=None: (jax.tree.map(_examples, updates), state),
    )


CASES = [
    # --- differential privacy (Optax's key splitting: parity holds exactly) ---------
    Case(
        "dpsgd",
        lambda: eqxopt.Chain(
            _PerExample(),
            eqxopt.DPSGD(0.1, 1.0, 0.5, 3, momentum=0.9, nesterov=True),
        ),
        lambda: optax.chain(
            _per_example_optax(),
            optax.contrib.dpsgd(0.1, 1.0, 0.5, 3, momentum=0.9, nesterov=True),
        ),
        bad=(
            (lambda: eqxopt.DPSGD(-0.1, 1.0, 0.5, 0), "learning_rate"),
            (lambda: eqxopt.DPSGD(0.1, -1.0, 0.5, 0), "l2_norm_clip"),
            (lambda: eqxopt.DPSGD(0.1, 1.0, -0.5, 0), "noise_multiplier"),
            (lambda: eqxopt.DPSGD(0.1, 1.0, 0.5, 0.5), "seed"),  # pyright: ignore
        ),
    ),
    Case(
        "dpsgd_no_momentum",
        lambda: eqxopt.Chain(
            _PerExample(),
            eqxopt.DPSGD(eqxopt.schedules.Linear(0.2, 0.05, 8), 0.7, 1.1, 5),
        ),
        lambda: optax.chain(
            _per_example_optax(),
            optax.contrib.dpsgd(optax.linear_schedule(0.2, 0.05, 8), 0.7, 1.1, 5),
        ),
        # Optax evaluates its schedules in float32 even under x64.
        rtol64=1e-6,
    ),
    Case(
        "differentially_private_aggregate",
        lambda: eqxopt.Chain(
            _PerExample(),
            eqxopt.DifferentiallyPrivateAggregate(0.8, 1.2, key=7),
            eqxopt.ScaleByLearningRate(0.1),
        ),
        lambda: optax.chain(
            _per_example_optax(),
            optax.contrib.differentially_private_aggregate(0.8, 1.2, key=7),
            optax.scale_by_learning_rate(0.1),
        ),
        bad=(
            (
                lambda: eqxopt.DifferentiallyPrivateAggregate(-1.0, 1.0),
                "l2_norm_clip",
            ),
            (
                lambda: eqxopt.DifferentiallyPrivateAggregate(1.0, -1.0),
                "noise_multiplier",
            ),
            (lambda: eqxopt.DifferentiallyPrivateAggregate(1.0, 1.0, key="a"), "key"),
        ),
    ),
    # --- ReduceOnPlateau (positive losses: the same decisions as Optax) --------------
    Case(
        "reduce_on_plateau",
        lambda: eqxopt.Chain(
            eqxopt.Adam(5e-3),
            eqxopt.ReduceOnPlateau(
                factor=0.5, patience=2, rtol=0.05, cooldown=1, accumulation_size=2
            ),
        ),
        lambda: optax.chain(
            optax.adam(5e-3),
            optax.contrib.reduce_on_plateau(
                factor=0.5, patience=2, rtol=0.05, cooldown=1, accumulation_size=2
            ),
        ),
        loss=_loss,
        extra=_value,
        steps=16,
    ),
    Case(
        "reduce_on_plateau_alone",
        lambda: eqxopt.ReduceOnPlateau(0.5, 1, 0.1, 0.01, 1, 1, 0.2),
        lambda: optax.contrib.reduce_on_plateau(0.5, 1, 0.1, 0.01, 1, 1, 0.2),
        extra=_value,  # random grads: the loss goes up and down
        optax_fn="contrib.reduce_on_plateau",
        bad=(
            (lambda: eqxopt.ReduceOnPlateau(factor=1.0), "factor"),
            (lambda: eqxopt.ReduceOnPlateau(factor=0.0), "factor"),
            (lambda: eqxopt.ReduceOnPlateau(rtol=-1e-3), "rtol"),
            (lambda: eqxopt.ReduceOnPlateau(rtol=2.0), "rtol"),
            (lambda: eqxopt.ReduceOnPlateau(atol=-1.0), "atol"),
            (lambda: eqxopt.ReduceOnPlateau(rtol=0.0, atol=0.0), "atol"),
            (lambda: eqxopt.ReduceOnPlateau(patience=-1), "patience"),
            (lambda: eqxopt.ReduceOnPlateau(cooldown=-1), "cooldown"),
            (lambda: eqxopt.ReduceOnPlateau(accumulation_size=0), "accumulation_size"),
            (lambda: eqxopt.ReduceOnPlateau(min_scale=-1.0), "min_scale"),
        ),
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
    # --- Sophia (Hutchinson probes from the same seed as Optax's) ---------------------
    Case(
        "sophia",
        lambda: eqxopt.Sophia(
            0.05,
            weight_decay=1e-2,
            weight_decay_mask=lambda p: p.ndim > 1,
            update_interval=3,
            clip_threshold=0.5,
        ),
        lambda: optax.contrib.sophia(
            0.05,
            weight_decay=1e-2,
            weight_decay_mask=_ndim2,
            update_interval=3,
            clip_threshold=0.5,
        ),
        loss=_loss,
        extra=_obj_fn,
        optax_fn="contrib.sophia",
        bad=(
            (lambda: eqxopt.Sophia(-1.0), "learning_rate"),
            (lambda: eqxopt.Sophia(0.1, b1=1.0), "b1"),
            (lambda: eqxopt.Sophia(0.1, b2=-0.1), "b2"),
            (lambda: eqxopt.Sophia(0.1, eps=-1.0), "eps"),
            (lambda: eqxopt.Sophia(0.1, gamma=0.0), "gamma"),
            (lambda: eqxopt.Sophia(0.1, clip_threshold=-1.0), "clip_threshold"),
            (lambda: eqxopt.Sophia(0.1, update_interval=0), "update_interval"),
            (
                lambda: eqxopt.Sophia(0.1, hessian_diagonal_fn=optax.sgd(0.1)),  # pyright: ignore
                "hessian_diagonal_fn",
            ),
        ),
    ),
    Case(
        "sophia_seeded_no_clip",
        lambda: eqxopt.Sophia(
            eqxopt.schedules.Linear(0.05, 0.01, 8),
            b1=0.9,
            b2=0.5,
            eps=0.5,
            gamma=0.5,
            clip_threshold=None,
            update_interval=2,
            # An int seed: constructing an optimizer creates no JAX array.
            hessian_diagonal_fn=eqxopt.HutchinsonEstimatorDiagHessian(5),
        ),
        lambda: optax.contrib.sophia(
            optax.linear_schedule(0.05, 0.01, 8),
            b1=0.9,
            b2=0.5,
            eps=0.5,
            gamma=0.5,
            clip_threshold=None,
            update_interval=2,
            hessian_diagonal_fn=optax.contrib.hutchinson_estimator_diag_hessian(
                jax.random.key(5)
            ),
        ),
        loss=_loss,
        extra=_obj_fn,
        # Optax evaluates its schedules in float32 even under x64.
        rtol64=1e-6,
    ),
    # --- MARS and Cautious (reference: NumPy transcriptions, tests/test_contrib_b.py) -
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
    Case(
        "cautious_adam",
        lambda: eqxopt.Cautious(eqxopt.Adam(1e-2)),
        bad=((lambda: eqxopt.Cautious(optax.adam(1e-2)), "optimizer"),),  # pyright: ignore
    ),
]
