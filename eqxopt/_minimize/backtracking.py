"""Backtracking line search: the Armijo (sufficient decrease) condition."""

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Bool, Float, Inexact, Int32, PyTree

from .._checks import check_hyperparams
from .._custom_types import Params, ScalarLike
from .._misc import (
    scalar,
    typechecked,
    zero_count,
)
from .linesearch import (
    AbstractLineSearch,
    AbstractLineSearchState,
    cast_like,
    evaluate,
    init_state,
    LineSearchResult,
    scalar_dtype,
    slope,
    tree_select,
)
from .loop import while_loop


@typechecked
class BacktrackingState(AbstractLineSearchState):
    """State of [`eqxopt.Backtracking`][]; the fields mean what they mean in
    [`eqxopt.ZoomState`][].

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt


        def loss(p):
            return jnp.sum((p - 1.0) ** 2)


        search, y = eqxopt.Backtracking(), jnp.zeros(3)
        value, grad = jax.value_and_grad(loss)(y)
        _, state = search.update(-grad, search.init(y), y, value=value, value_fn=loss)
        assert state.step_size == 0.5 and state.num_evals == 2  # step 1 overshot
        assert not state.failed and state.value == 0.0  # the loss at y + step
        ```
    """

    step_size: Float[Array, ""]
    value: Float[Array, ""]
    grad: PyTree[Inexact[Array, "..."]]
    num_evals: Int32[Array, ""]
    failed: Bool[Array, ""]
    result: LineSearchResult


class _Carry(eqx.Module):
    i: Array
    t: Array
    f: Array
    g: PyTree
    accepted: Array
    nonfinite: Array


class Backtracking(AbstractLineSearch[BacktrackingState]):
    r"""Backtracking line search for a step with sufficient decrease.

    Along a descent direction $d$ from $x$, with $\phi(t) = f(x + t d)$, it tries
    $t_0, \rho t_0, \rho^2 t_0, \ldots$ ($\rho$ = `decrease_factor`) and returns the
    first step with

    $$\phi(t) \le \phi(0) + c_1 t \phi'(0)$$

    (the Armijo condition). It evaluates the loss and its gradient together at each
    trial, so the gradient at the accepted point is in the state for the next
    iteration. A non-finite trial value counts as no decrease. If no trial succeeds
    within `max_steps` evaluations (or the direction is not a descent direction), the
    step is zero, `failed` is set and `result` says why.

    ??? cite "References"

        ```bibtex
        @article{armijo1966minimization,
            title={Minimization of functions having Lipschitz continuous first
                   partial derivatives},
            author={Armijo, Larry},
            journal={Pacific Journal of Mathematics},
            volume={16}, number={1}, pages={1--3}, year={1966}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        def loss(y):
            return jnp.sum((y - jnp.arange(3.0)) ** 2)


        opt = eqxopt.LBFGS(linesearch=eqxopt.Backtracking(decrease_factor=0.5))
        sol = eqxopt.minimize(lambda y, args: loss(y), opt, jnp.zeros(3))
        ```
    """

    c1: ScalarLike = 1e-4
    decrease_factor: ScalarLike = 0.5
    max_steps: int = eqx.field(default=30, static=True)
    initial_step: str = eqx.field(default="one", static=True)
    increase_factor: ScalarLike = 2.0
    max_step_size: ScalarLike | None = None

    def __check_init__(self):
        check_hyperparams(
            self,
            positive=("c1", "decrease_factor")
            + (("max_step_size",) if self.max_step_size is not None else ()),
            unit_interval=("c1", "decrease_factor"),
            positive_int=("max_steps",),
            choices={"initial_step": ("one", "keep")},
        )
        f = self.increase_factor
        if isinstance(f, (int, float)) and f < 1:
            raise ValueError(
                f"`Backtracking(increase_factor=...)` must be >= 1, got {f}."
            )

    def init(self, params: Params) -> BacktrackingState:
        return init_state(BacktrackingState, params)

    def search(
        self, value_and_grad_fn, params, direction, value, grad, state, max_step=None
    ):
        dtype = scalar_dtype(params)
        c1 = scalar(self.c1, dtype)
        rho = scalar(self.decrease_factor, dtype)
        zero = jnp.zeros((), dtype)
        grad = cast_like(grad, state.grad)
        f0 = jnp.real(jnp.asarray(value)).astype(dtype)
        s0 = slope(grad, direction, dtype)
        if self.initial_step == "one":
            t0 = jnp.ones((), dtype)
        else:
            previous = state.step_size.astype(dtype)
            t0 = jnp.where(
                previous > 0,
                scalar(self.increase_factor, dtype) * previous,
                jnp.ones((), dtype),
            )
        if self.max_step_size is not None:
            t0 = jnp.minimum(t0, scalar(self.max_step_size, dtype))
        if max_step is not None:
            t0 = jnp.minimum(t0, jnp.asarray(max_step).astype(dtype))
        finite0 = jnp.isfinite(f0) & jnp.isfinite(s0)
        start_ok = finite0 & (s0 < 0)
        false = jnp.zeros((), bool)
        init = _Carry(zero_count(), t0, f0, grad, false, ~finite0)

        def cond(c: _Carry):
            return start_ok & ~c.accepted & (c.i < self.max_steps)

        def body(c: _Carry) -> _Carry:
            t = jnp.where(c.i == 0, t0, rho * c.t)
            f, g, _ = evaluate(value_and_grad_fn, params, direction, t, grad, dtype)
            finite = jnp.isfinite(f) & _all_finite(g)
            accepted = finite & (f <= f0 + c1 * t * s0)
            return _Carry(c.i + 1, t, f, g, accepted, c.nonfinite | ~finite)

        c = while_loop(cond, body, init, max_steps=self.max_steps)
        ok = start_ok & c.accepted
        step = jnp.where(ok, c.t, zero)
        R = LineSearchResult
        result = R.where(
            ok,
            R.successful,
            R.where(
                finite0 & (s0 >= 0),
                R.not_descent,
                R.where(c.nonfinite, R.nonfinite, R.max_steps_reached),
            ),
        )
        new_state = BacktrackingState(
            step_size=jnp.where(ok, c.t, state.step_size.astype(dtype)).astype(
                state.step_size.dtype
            ),
            value=jnp.where(ok, c.f, f0).astype(state.value.dtype),
            grad=cast_like(tree_select(ok, c.g, grad), state.grad),
            num_evals=c.i,
            failed=~ok,
            result=result,
        )
        return step, new_state


def _all_finite(tree) -> Array:
    out = jnp.ones((), bool)
    for x in jtu.tree_leaves(tree):
        out = out & jnp.all(jnp.isfinite(x))
    return out


Backtracking.__init__.__doc__ = r"""**Arguments:**

- `c1`: the sufficient-decrease constant $c_1$, in (0, 1).
- `decrease_factor`: $\rho$ in (0, 1), the factor by which a rejected step shrinks.
- `max_steps`: the maximum number of function-and-gradient evaluations per search.
    (Static.)
- `initial_step`: `"one"` (a unit first trial, for quasi-Newton directions) or
    `"keep"` (the last accepted step times `increase_factor`, for gradient descent).
    (Static.)
- `increase_factor`: with `initial_step="keep"`, the factor (>= 1) by which the last
    accepted step grows to give the first trial.
- `max_step_size`: an upper bound on the first trial step, or `None`.
"""
