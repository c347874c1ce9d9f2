"""L-BFGS: the limited-memory BFGS quasi-Newton method with a line search."""

from typing import Any

import equinox as eqx
import jax.lax as lax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Inexact, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import scalar_hyperparams
from .._custom_types import Params, ScalarOrSchedule, Updates
from .._misc import (
    increment,
    out_dtype,
    resolve,
    scalar,
    sharded_like,
    tree_map,
    typechecked,
    zero_count,
    zeros_like,
)
from .linesearch import (
    AbstractLineSearch,
    AbstractLineSearchOptimizer,
    after_search,
    direction_of,
    Evaluation,
    index,
    memory_difference,
    memory_push,
    ProjectedValueAndGrad,
    scalar_dtype,
    select,
    step_updates,
    store_dtype,
    tree_vdot,
    value_and_grad_of,
)
from .zoom import Zoom


@typechecked
class LBFGSState(eqx.Module):
    """State of [`eqxopt.LBFGS`][].

    - `count`: the number of updates made (int32).
    - `s_memory`, `y_memory`: ring buffers of the last `memory_size` parameter and
        gradient differences, one leaf of shape `(memory_size, *param.shape)` per
        param, in the param's dtype (or `state_dtype`).
    - `rho_memory`: `1 / <s_i, y_i>` per slot; 0 marks an empty or dropped slot.
    - `head`: the slot the next pair is written to (int32).
    - `gamma`: the initial inverse-Hessian scale $s^\\top y / y^\\top y$ of the newest
        pair; 0 while the memory is empty.
    - `linesearch_state`: the line search's state. Its `value` and `grad` are the loss
        and gradient at the params after the last update: pass them to the next
        update to save an evaluation (as [`eqxopt.minimize`][] does).
    - `prev_params`, `prev_grads`: without a line search, the previous params and
        gradients (to form the next pair); `None` otherwise.
    - `stalled`: whether the last update's line search failed along a steepest-descent
        direction below the resolution of the params (the limit of precision).
    - `failed`: whether the last update's line search failed along the
        steepest-descent direction otherwise (a failure along an L-BFGS direction
        instead clears the memory and returns a zero update, and the next update
        starts again from steepest descent).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        opt = eqxopt.LBFGS(memory_size=5)
        state = opt.init({"w": jnp.zeros(3)})
        assert state.s_memory["w"].shape == (5, 3)  # the last 5 steps s_k
        assert state.y_memory["w"].shape == (5, 3)  # and gradient changes y_k
        state.linesearch_state  # a ZoomState
        ```
    """

    count: Int32[Array, ""]
    s_memory: PyTree[Inexact[Array, "m ..."]]
    y_memory: PyTree[Inexact[Array, "m ..."]]
    rho_memory: Float[Array, " m"]
    head: Int32[Array, ""]
    gamma: Float[Array, ""]
    linesearch_state: Any
    stalled: Bool[Array, ""]
    prev_params: PyTree[Inexact[Array, "..."]] | None
    prev_grads: PyTree[Inexact[Array, "..."]] | None
    failed: Bool[Array, ""]


def _two_loop(grads, s_memory, y_memory, rho, head, gamma, dtype):
    """`H g` by the L-BFGS two-loop recursion (Nocedal & Wright, Alg. 7.4), newest pair
    first; slots with `rho == 0` contribute nothing."""
    m = rho.shape[0]
    # Oldest ... newest. `lax.rem` (one op) for `%` (a nested function of ~20 ops
    # for Python's sign rules; the operands here are non-negative).
    order = lax.rem(head + jnp.arange(m, dtype=jnp.int32), jnp.int32(m))
    rho = rho.astype(dtype)
    q = direction_of(grads)

    def pick(memory, i):
        return tree_map(lambda x: index(x, i), memory)

    def axpy(a, x, y):  # y + a x, per leaf in y's dtype
        return tree_map(
            lambda x, y: y + a.astype(y.dtype) * x.astype(y.dtype),
            x,
            y,
            names=("x", "y"),
        )

    def first(q, i):
        alpha = pick(rho, i) * tree_vdot(pick(s_memory, i), q, dtype)
        return axpy(-alpha, pick(y_memory, i), q), alpha

    q, alphas = lax.scan(first, q, order, reverse=True)
    r = tree_map(lambda x: gamma.astype(x.dtype) * x, q)

    def second(r, i_alpha):
        i, alpha = i_alpha
        beta = pick(rho, i) * tree_vdot(pick(y_memory, i), r, dtype)
        return axpy(alpha - beta, pick(s_memory, i), r), None

    r, _ = lax.scan(second, r, (order, alphas))
    return r


class LBFGS(AbstractLineSearchOptimizer[LBFGSState]):
    r"""L-BFGS: a quasi-Newton method for deterministic (full-batch) losses.

    The update is $u_k = t_k d_k$ with the direction $d_k = -\eta_k H_k g_k$, where
    $H_k$ is the limited-memory BFGS approximation of the inverse Hessian built from
    the last `memory_size` pairs $s_i = x_{i+1} - x_i$, $y_i = g_{i+1} - g_i$ by the
    two-loop recursion, starting from $\gamma_k I$ with

    $$\gamma_k = \frac{s_{k-1}^\top y_{k-1}}{y_{k-1}^\top y_{k-1}}
      \quad(\text{first step: } \min(1, 1/\|g_0\|)),$$

    $\eta_k$ is `learning_rate` (1 by default) and $t_k$ is found by the line search
    (default: [`eqxopt.Zoom`][], strong Wolfe conditions; `linesearch=None` means
    $t_k = 1$). Pairs with non-positive curvature ($s^\top y \le \epsilon\,
    y^\top y$) are skipped, so $H_k$ stays positive definite. The memory is a ring
    buffer in the state, in the params' dtype.

    `update(grads, state, params, *, value, value_fn)` needs the loss `value` at
    `params` and `value_fn: params -> loss` for the line search. The line search's
    last evaluation is reused to form the new pair, and the state keeps the loss and
    gradient at the new params (`state.linesearch_state.value` / `.grad`), so a step
    costs one function-and-gradient evaluation when the first trial step is accepted
    ([`eqxopt.minimize`][] does this for you).

    It is `optax.lbfgs` (same two-loop recursion and line-search algorithm; the same
    iterates on a quadratic), with deliberate differences: pairs with non-positive
    curvature are skipped (Optax stores them); the first step has unit length, as in
    L-BFGS-B (Optax caps it at length $\min(1, \|g_0\|)$); and the default
    [`eqxopt.Zoom`][] tries the two-slope cubic first, grows the step while bracketing
    as MINPACK's `dcsrch` (scipy's L-BFGS-B) rather than doubling it, and uses the
    exact strong Wolfe conditions except at rounding level (see there). With them it
    needs about as many evaluations as scipy's L-BFGS-B on `benchmarks/minimize.py`.
    If the line search fails along an L-BFGS direction, the memory is cleared, the
    update is zero and the next update restarts from steepest descent; `state.failed`
    is set only when the search fails along steepest descent too.

    ??? cite "References"

        ```bibtex
        @article{liu1989limited,
            title={On the limited memory {BFGS} method for large scale optimization},
            author={Liu, Dong C. and Nocedal, Jorge},
            journal={Mathematical Programming},
            volume={45}, number={1}, pages={503--528}, year={1989}}

        @book{nocedal2006numerical,
            title={Numerical Optimization},
            author={Nocedal, Jorge and Wright, Stephen J.},
            publisher={Springer}, edition={2}, year={2006}}
        ```

    !!! Example

        ```python
        import equinox as eqx
        import jax
        import jax.numpy as jnp

        import eqxopt


        def loss(p):
            return jnp.sum((p["w"] - 2.0) ** 2)


        opt, params = eqxopt.LBFGS(), {"w": jnp.zeros(3)}
        state = opt.init(params)
        value, grad = jax.value_and_grad(loss)(params)


        @eqx.filter_jit
        def step(params, grad, state, value):
            return opt.step(params, grad, state, value=value, value_fn=loss)


        for _ in range(3):  # the line search kept f and grad f at the new params:
            params, state = step(params, grad, state, value)
            value, grad = state.linesearch_state.value, state.linesearch_state.grad
        ```
    """

    learning_rate: ScalarOrSchedule | None = None
    memory_size: int = eqx.field(default=10, static=True)
    scale_init_precond: bool = eqx.field(default=True, static=True)
    linesearch: AbstractLineSearch | None = Zoom()
    state_dtype: Any = eqx.field(default=None, static=True, kw_only=True)

    def __check_init__(self):
        check_hyperparams(
            self,
            positive_int=("memory_size",),
            nonnegative=(("learning_rate",) if self.learning_rate is not None else ()),
        )
        if self.linesearch is not None and not isinstance(
            self.linesearch, AbstractLineSearch
        ):
            raise ValueError(
                "`LBFGS(linesearch=...)` must be an eqxopt line search "
                "(`eqxopt.Zoom()`, `eqxopt.Backtracking()`) or None, got "
                f"{type(self.linesearch).__name__}."
            )

    def init(self, params: Params) -> LBFGSState:
        m = self.memory_size
        dtype = store_dtype(params, self.state_dtype)

        def stacked(p):
            return jnp.zeros((m,) + p.shape, self.state_dtype or p.dtype)

        if self.linesearch is None:
            ls_state = None
            prev = zeros_like(params, self.state_dtype)
        else:
            like = params
            if self.state_dtype is not None:
                like = tree_map(lambda p: jnp.zeros(p.shape, self.state_dtype), params)
            ls_state = self.linesearch.init(like)
            prev = None
        return LBFGSState(
            count=zero_count(),
            s_memory=tree_map(stacked, params),
            y_memory=tree_map(stacked, params),
            rho_memory=jnp.zeros((m,), dtype),
            head=zero_count(),
            gamma=jnp.zeros((), dtype),
            linesearch_state=ls_state,
            stalled=jnp.zeros((), bool),
            prev_params=prev,
            prev_grads=prev,
            failed=jnp.zeros((), bool),
        )

    def update(
        self,
        grads: Updates,
        state: LBFGSState,
        params: Params | None = None,
        *,
        value=None,
        value_fn=None,
        **extra,
    ) -> tuple[Updates, LBFGSState]:
        need_params(self, params)
        if self.linesearch is not None and value_fn is None:
            raise ValueError(
                "`LBFGS.update` needs the extra argument `value_fn=` (a function "
                "`params -> loss`, for the line search) and `value=` (the loss at "
                "`params`); pass `linesearch=None` for fixed steps."
            )
        dtype = scalar_dtype(params)
        s_mem, y_mem = state.s_memory, state.y_memory
        rho, head, gamma = state.rho_memory, state.head, state.gamma

        if self.linesearch is None:
            # No line search: the newest pair comes from the previous call.
            s = memory_difference(params, state.prev_params)
            y = memory_difference(grads, state.prev_grads)
            first = state.count == 0
            s = tree_map(lambda x: jnp.where(first, jnp.zeros_like(x), x), s)
            y = tree_map(lambda x: jnp.where(first, jnp.zeros_like(x), x), y)
            s_mem, y_mem, rho, head, gamma = memory_push(
                s_mem, y_mem, rho, head, gamma, s, y, dtype
            )

        if self.scale_init_precond:
            # Before the first pair, the first step has unit length, as in L-BFGS-B
            # (Optax takes min(1, 1 / |g|)). NaN-safe under autodiff at g = 0.
            sq = tree_vdot(grads, grads, dtype)
            initial = select(sq > 0, 1 / jnp.sqrt(select(sq > 0, sq, 1)), 1)
            scale = select(gamma > 0, gamma.astype(dtype), initial.astype(dtype))
        else:
            scale = jnp.ones((), dtype)
        direction = _two_loop(grads, s_mem, y_mem, rho, head, scale, dtype)
        lr = (
            1.0
            if self.learning_rate is None
            else resolve(self.learning_rate, state.count)
        )
        direction = tree_map(lambda d: -scalar(lr, d.dtype) * d, direction)

        if self.linesearch is None:
            updates = tree_map(
                lambda d, g, p: d.astype(out_dtype(g, p)),
                direction,
                grads,
                params,
                names=("direction", "grads", "params"),
            )
            new_state = LBFGSState(
                count=increment(state.count),
                s_memory=s_mem,
                y_memory=y_mem,
                rho_memory=rho,
                head=head,
                gamma=gamma,
                linesearch_state=None,
                stalled=state.stalled,
                prev_params=tree_map(
                    lambda p, q: sharded_like(p.astype(q.dtype), q),
                    params,
                    state.prev_params,
                ),
                prev_grads=tree_map(
                    lambda g, q: sharded_like(g.astype(q.dtype), q),
                    grads,
                    state.prev_grads,
                ),
                failed=state.failed,
            )
            return updates, new_state

        assert value_fn is not None  # checked above: a line search needs it
        value_and_grad_fn = value_and_grad_of(value_fn)
        if value is None:
            value = value_fn(params)
        step, ls_state = self.linesearch.search(
            value_and_grad_fn,
            params,
            direction,
            jnp.asarray(value),
            grads,
            state.linesearch_state,
        )
        updates = step_updates(step, direction, params)
        new_params = eqx.apply_updates(params, updates)
        new_grad = None
        if isinstance(value_and_grad_fn, ProjectedValueAndGrad):
            # A projected method: the search keeps the gradient at the projected
            # point (the caller's next one); the pair takes the derivative of the
            # loss seen through the projection at `new_params`, as `value_fn`'s.
            new_grad = value_and_grad_fn.path_grad(ls_state.grad, new_params)
        (s_mem, y_mem, rho, head, gamma), stalled, failed = after_search(
            state,
            (s_mem, y_mem, rho, head, gamma),
            new_params,
            params,
            grads,
            direction,
            ls_state,
            dtype,
            new_grad,
        )
        new_state = LBFGSState(
            count=increment(state.count),
            s_memory=s_mem,
            y_memory=y_mem,
            rho_memory=rho,
            head=head,
            gamma=gamma,
            linesearch_state=ls_state,
            stalled=stalled,
            prev_params=None,
            prev_grads=None,
            failed=failed,
        )
        return updates, new_state

    def hyperparams(self, state: LBFGSState) -> dict[str, Any]:
        out = scalar_hyperparams(self, state.count)
        if self.linesearch is not None:
            out["linesearch"] = self.linesearch.hyperparams(state.linesearch_state)
        return out

    def last_evaluation(self, state: LBFGSState) -> Evaluation | None:
        """The loss and gradient the line search evaluated at the params after the
        last update (`None` without a line search)."""
        if self.linesearch is None:
            return None
        ls = state.linesearch_state
        return Evaluation(ls.value, ls.grad, state.failed, ls.num_evals, state.stalled)


LBFGS.__init__.__doc__ = r"""**Arguments:** (in `optax.lbfgs`'s order)

- `learning_rate`: $\eta$, scaling the direction before the line search; a number,
    an array, a schedule, or `None` (default) for 1.
- `memory_size`: the number $m \ge 1$ of pairs kept. (Static.)
- `scale_init_precond`: start the two-loop recursion from $\gamma_k I$ (default) or
    from $I$. (Static.)
- `linesearch`: an [`eqxopt.Zoom`][] (default: `Zoom()`, strong Wolfe, at most 20
    evaluations, as Optax's L-BFGS), an [`eqxopt.Backtracking`][], or `None` for a
    fixed step $\eta$.
- `state_dtype`: dtype of the memory buffers and cached scalars; default the
    params'. (Static, keyword-only.)
"""
