"""SGD and its relatives (momentum, sign methods, Lion, LARS, noise, Fromage, Rprop,
optimistic gradients, DP-SGD), each against its Optax counterpart."""

import jax
import jax.numpy as jnp
import optax

import eqxopt
from eqxopt._misc import tree_map

from ..helpers import Case, is_matrix, ndim2_mask


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
    # --- Lion -------------------------------------------------------------------------
    Case(
        "lion",
        lambda: eqxopt.Lion(3e-3, b1=0.8, b2=0.95, weight_decay=0.1, mask=is_matrix),
        lambda: optax.lion(3e-3, b1=0.8, b2=0.95, weight_decay=0.1, mask=ndim2_mask),
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
    Case(
        "lars",
        lambda: eqxopt.Lars(
            0.5,
            weight_decay=0.01,
            weight_decay_mask=is_matrix,
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
            weight_decay_mask=ndim2_mask,
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
    # --- sign methods ----------------------------------------------------------------
    Case(
        "sign_sgd",
        lambda: eqxopt.SignSGD(0.03),
        lambda: optax.sign_sgd(0.03),
        bad=((lambda: eqxopt.SignSGD(-0.1), "learning_rate"),),
    ),
    Case(
        "signum",
        lambda: eqxopt.Signum(0.02, beta=0.8),
        lambda: optax.signum(0.02, beta=0.8),
        bad=((lambda: eqxopt.Signum(0.1, beta=1.0), "beta"),),
    ),
    # --- Fromage ---------------------------------------------------------------------
    Case(
        "fromage",
        lambda: eqxopt.Fromage(0.05, min_norm=1e-4),
        lambda: optax.fromage(0.05, min_norm=1e-4),
        bad=(
            (lambda: eqxopt.Fromage(-0.1), "learning_rate"),
            (lambda: eqxopt.Fromage(0.1, min_norm=-1.0), "min_norm"),
        ),
    ),
    # --- gradient noise (same key usage as Optax: parity holds exactly) -------------
    Case(
        "noisy_sgd",
        lambda: eqxopt.NoisySGD(0.05, eta=0.02, gamma=0.6, key=3),
        lambda: optax.noisy_sgd(0.05, eta=0.02, gamma=0.6, key=3),
        bad=(
            (lambda: eqxopt.NoisySGD(-0.1), "learning_rate"),
            (lambda: eqxopt.NoisySGD(0.1, eta=-1.0), "eta"),
            (lambda: eqxopt.NoisySGD(0.1, gamma=-0.5), "gamma"),
            (lambda: eqxopt.NoisySGD(0.1, key="seed"), "key"),
        ),
    ),
    Case(
        "add_noise",
        lambda: eqxopt.AddNoise(0.05, 0.5, key=7),
        lambda: optax.add_noise(0.05, 0.5, key=7),
        bad=((lambda: eqxopt.AddNoise(-1.0, 0.5), "eta"),),
    ),
    # --- Rprop, optimistic methods ---------------------------------------------------
    Case(
        "rprop",
        lambda: eqxopt.Rprop(
            0.02, eta_minus=0.4, eta_plus=1.5, min_step_size=1e-3, max_step_size=0.05
        ),
        # No Optax reference: optax 0.2.8's `scale_by_rprop` emits the previous step's
        # update (one step stale, zero at first; optax PR #1725). eqxopt follows the
        # paper and torch.optim.Rprop, checked in NumPy in test_sgd.py.
        None,
        bad=(
            (lambda: eqxopt.Rprop(-0.1), "learning_rate"),
            (lambda: eqxopt.Rprop(0.1, eta_minus=0.0), "eta_minus"),
            (lambda: eqxopt.Rprop(0.1, min_step_size=-1.0), "min_step_size"),
        ),
    ),
    Case(
        "optimistic_gradient_descent",
        lambda: eqxopt.OptimisticGradientDescent(0.05, alpha=0.7, beta=0.4),
        lambda: optax.optimistic_gradient_descent(0.05, alpha=0.7, beta=0.4),
        bad=((lambda: eqxopt.OptimisticGradientDescent(-0.1), "learning_rate"),),
    ),
    Case(
        "optimistic_adam",
        lambda: eqxopt.OptimisticAdam(
            1e-2, alpha=0.8, beta=0.6, b1=0.85, b2=0.99, eps=1e-6
        ),
        lambda: optax.optimistic_adam_v2(
            1e-2, alpha=0.8, beta=0.6, b1=0.85, b2=0.99, eps=1e-6
        ),
        optax_fn="optimistic_adam_v2",
        bad=(
            (lambda: eqxopt.OptimisticAdam(1e-3, b1=1.0), "b1"),
            (lambda: eqxopt.OptimisticAdam(1e-3, eps=-1.0), "eps"),
        ),
    ),
]
