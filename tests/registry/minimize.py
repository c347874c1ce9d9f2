"""L-BFGS and the line searches as optimizers (every step does not retrace; `extra`
passes `value`, `grad` and `value_fn`), against Optax's `lbfgs` and line searches."""

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import optax

import eqxopt

from ..helpers import Case


def quadratic_loss(params):
    """A diagonal quadratic with curvatures 1..4 across the leaves, minimum at 0.3."""
    leaves = jtu.tree_leaves(params)
    total = jnp.zeros((), leaves[0].dtype)
    for k, x in enumerate(leaves):
        total = total + 0.5 * (k + 1) * jnp.sum((x - 0.3) ** 2)
    return total


def _extra(params):
    return {
        "value": quadratic_loss(params),
        "grad": jax.grad(quadratic_loss)(params),
        # A `Partial` is a PyTree (the function is static), so plain `jax.jit` takes it.
        "value_fn": jtu.Partial(quadratic_loss),
    }


CASES = [
    Case(
        "lbfgs",
        lambda: eqxopt.LBFGS(
            memory_size=4,
            # Optax's bracketing (doubling the step): this case's first trial step
            # is too short and the search brackets (eqxopt's default extrapolates).
            linesearch=eqxopt.Zoom(
                c2=0.8, max_steps=15, approx_dec_rtol=1e-6, extrapolation="multiply"
            ),
        ),
        lambda: optax.lbfgs(
            memory_size=4,
            linesearch=optax.scale_by_zoom_linesearch(
                max_linesearch_steps=15, curv_rtol=0.8, initial_guess_strategy="one"
            ),
        ),
        # float32: the line search's accept/reject decisions amplify rounding
        # differences (summation order of the inner products) from step to step.
        rtol=1e-4,
        atol=1e-5,
        rtol64=1e-8,
        loss=quadratic_loss,
        extra=_extra,
        wrappable=False,  # accumulating the gradients of a line search: meaningless
        bad=(
            (lambda: eqxopt.LBFGS(memory_size=0), "memory_size"),
            (lambda: eqxopt.LBFGS(-1.0), "learning_rate"),
        ),
        optax_fn="lbfgs",
    ),
    Case(
        "lbfgs_fixed_step",
        lambda: eqxopt.LBFGS(memory_size=3, learning_rate=0.3, linesearch=None),
        lambda: optax.lbfgs(memory_size=3, learning_rate=0.3, linesearch=None),
        rtol=1e-5,
        loss=quadratic_loss,
    ),
    Case(
        "lbfgs_backtracking",
        lambda: eqxopt.LBFGS(
            memory_size=5, linesearch=eqxopt.Backtracking(decrease_factor=0.7)
        ),
        loss=quadratic_loss,
        extra=_extra,
        wrappable=False,
    ),
    Case(
        "zoom_gradient_descent",
        lambda: eqxopt.Chain(
            eqxopt.Scale(-1.0),
            eqxopt.Zoom(
                c2=0.7,
                max_steps=12,
                initial_step="keep",
                approx_dec_rtol=1e-6,
                extrapolation="multiply",  # Optax's bracketing, as in "lbfgs"
            ),
        ),
        lambda: optax.chain(
            optax.scale(-1.0),
            optax.scale_by_zoom_linesearch(
                max_linesearch_steps=12, curv_rtol=0.7, initial_guess_strategy="keep"
            ),
        ),
        rtol=1e-4,  # as for "lbfgs"
        atol=1e-5,
        rtol64=1e-8,
        loss=quadratic_loss,
        extra=_extra,
        wrappable=False,
    ),
    Case(
        "backtracking_gradient_descent",
        lambda: eqxopt.Chain(
            eqxopt.Scale(-1.0),
            eqxopt.Backtracking(c1=1e-3, initial_step="keep", increase_factor=1.5),
        ),
        loss=quadratic_loss,
        extra=_extra,
        wrappable=False,
    ),
]
