"""`RESULTS` and `Solution`: what [`eqxopt.minimize`][] returns."""

from typing import Any

import equinox as eqx
import numpy as np
from jaxtyping import Array, ArrayLike, PyTree


class RESULTS(eqx.Enumeration):
    """How a call to [`eqxopt.minimize`][] or [`eqxopt.least_squares`][] ended.

    `eqxopt.RESULTS[sol.result]` is the message (an error raised by a solve begins
    with the name of the function that raised it); `sol.result == RESULTS.successful` is
    a boolean array (usable under `jit`).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        def loss(y, args):
            return jnp.sum((y - 3.0) ** 2)


        sol = eqxopt.minimize(
            loss, eqxopt.SGD(0.01), jnp.zeros(2), max_steps=10, throw=False
        )
        assert sol.result == eqxopt.RESULTS.max_steps_reached  # 10 steps are too few
        print(eqxopt.RESULTS[sol.result])  # the message, with advice
        ```
    """

    successful = ""
    max_steps_reached = (
        "`RESULTS.max_steps_reached`: the maximum number of steps was reached before "
        "the convergence test held (`minimize`: `max|grad| <= atol + rtol * |loss|`; "
        "`least_squares`: SciPy's `ftol`, `xtol` or `gtol` test). Increase "
        "`max_steps`, loosen the tolerances, or use a better-suited optimizer (for a "
        "deterministic full-batch loss, `eqxopt.LBFGS()` usually needs far fewer steps "
        "than a first-order method)."
    )
    nonfinite = (
        "`RESULTS.nonfinite`: the loss or its gradient (with `least_squares`, the "
        "residuals or their Jacobian) became non-finite (inf or NaN). Check that `fn` "
        "is finite at `y0` and in its "
        "neighbourhood; with a first-order optimizer lower the learning rate; "
        "reparameterize constrained parameters (e.g. optimize `log(x)` for a positive "
        "`x`); or enable float64 (`jax.config.update('jax_enable_x64', True)`) if "
        "values overflow."
    )
    linesearch_failed = (
        "`RESULTS.linesearch_failed`: the line search found no step "
        "with sufficient decrease, even along the steepest-descent direction. This "
        "usually means the tolerances are below what the floating-point precision "
        "allows (loosen `rtol`/`atol`, or enable float64), that `fn` is not smooth or "
        "not deterministic, or that its gradient is wrong (check custom derivatives). "
        "Increasing the line search's `max_steps` can help on badly scaled problems."
    )
    precision_limit = (
        "`RESULTS.precision_limit`: the solve stopped where no further decrease is "
        "possible in floating point (the steps round away: the line search could not "
        "move the point, several line-search steps in a row left the loss "
        "undecreased, or first-order steps in a row left the point, the optimizer's "
        "state and its hyperparameters unchanged; with `least_squares`, no trial step "
        "decreased the cost however small the trust region), at a point that is not "
        "provably a minimum: the convergence test does not hold. The tolerances are "
        "probably below what the precision allows: loosen them (`rtol`/`atol`, or "
        "`ftol`/`xtol`/`gtol`), enable float64, or rescale the problem (its loss or "
        "its variables)."
    )
    infeasible = (
        "`RESULTS.infeasible`: the constraint violation stopped "
        "decreasing while the augmented Lagrangian's penalty was at its cap "
        "(`AugmentedLagrangian(max_penalty=...)`): the constraints (with the bounds) "
        "probably have no feasible point. Check them; from another `y0` a local "
        "solver may find one; if they are feasible but badly scaled, rescale them or "
        "raise `max_penalty`."
    )


# Results print as `eqxopt.RESULTS<message>` (equinox's form), and every message but
# success's empty one names its result.
RESULTS.__module__ = "eqxopt"


def succeeded(item) -> bool:
    """Whether a concrete `RESULTS` item is `RESULTS.successful`."""
    return bool(np.asarray(item == RESULTS.successful))


def error_if_failed(sol: Any, result: Any, entry: str) -> Any:
    """`sol`, with a runtime error (under `jit`) when `result` is not successful,
    whose message is `result`'s prefixed by the entry point's name (`entry`, e.g.
    `"eqxopt.least_squares"`)."""
    messages = [m if m == "" else f"{entry}: {m}" for m in RESULTS._index_to_message]
    return eqx.branched_error_if(
        sol, result != RESULTS.successful, result._value, messages
    )


class Solution(eqx.Module):
    r"""The result of [`eqxopt.minimize`][].

    **Attributes:**

    - `value`: the final `y`.
    - `loss`: `fn(value, args)` (its first output with `has_aux=True`).
    - `aux`: the auxiliary output of `fn` at `value` (`None` without `has_aux`).
    - `state`: the optimizer's final state.
    - `result`: an [`eqxopt.RESULTS`][] item: `successful`, `max_steps_reached`,
        `nonfinite`, `linesearch_failed`, `precision_limit` or (with constraints)
        `infeasible`; `print(sol.result)`
        shows its message, which names it.
    - `stats`: a dict with `num_steps` (updates applied, int32), `num_fevals` (calls
        of `fn`; value and gradient together count once; int32) and `history` (length
        `max_steps`: `history[i]` is the loss at the start of step `i`, NaN from
        `num_steps` on). `num_fevals` counts the calls of `minimize` and of the line
        searches of [`eqxopt.LBFGS`][] and [`eqxopt.LBFGSB`][], not those an
        optimizer makes itself through `value_fn=`, `obj_fn=` or `grad_fn=` (Sophia's
        Hessian estimates, SAM's opaque mode, a line search inside a `Chain`, Optax's
        L-BFGS through `from_optax`). With [`eqxopt.NewtonCG`][]: `num_hvps`
        (Hessian-vector products; each calls `fn` once more). With constraints
        ([`eqxopt.AugmentedLagrangian`][]): steps are outer iterations, `num_cevals`
        counts the evaluations of the constraints (`eq` and `ineq` together once),
        and `max_violation` is `max(|eq|_inf, max(-ineq, 0))` at `value`.
    - `multipliers`: with constraints, `{"eq": ..., "ineq": ...}`, the Lagrange
        multipliers at `value`, each of its constraint's output structure (`None` for
        a kind with no constraint), in SciPy's sign convention: $\nabla f =
        J_{eq}^\top \lambda + J_{ineq}^\top \mu$ with $\mu \ge 0$. `None` without
        constraints.
    - `residuals`: from [`eqxopt.least_squares`][] only (else `None`): the residuals
        at `value`, as `fn` returns them.
    - `jac`: from [`eqxopt.least_squares`][] only: the Jacobian of the residuals at
        `value` as a dense matrix, rows over `ravel_pytree(residuals)`'s order and
        columns over `ravel_pytree(y0)`'s; `None` with `jac="matrix-free"`. There
        `stats` also has `num_jevals` (Jacobian evaluations) and `loss` is SciPy's
        `cost`, `0.5 * sum(residuals**2)`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        def loss(y, args):
            return jnp.sum((y - args) ** 2)


        sol = eqxopt.minimize(loss, eqxopt.LBFGS(), jnp.zeros(3), args=jnp.arange(3.0))
        sol.value, sol.loss  # ~[0, 1, 2], ~0
        sol.stats["num_steps"], sol.stats["num_fevals"]  # int32 counts
        ```
    """

    value: PyTree[Any]
    loss: Array
    aux: Any
    state: Any
    result: RESULTS
    stats: dict[str, PyTree[ArrayLike]]
    residuals: PyTree[Array] | None = None
    jac: Array | None = None
    multipliers: dict[str, PyTree[Array] | None] | None = None
