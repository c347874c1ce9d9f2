"""`least_squares`: nonlinear least squares with SciPy's trust-region methods."""

from collections.abc import Callable
from typing import Any, no_type_check

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxtyping import PyTree

from .._bounds import broadcast_bounds, check_bounds
from .._minimize.solution import error_if_failed, Solution
from .._minimize.solve import (
    ADJOINTS,
    Carry,
    check_options,
    check_solver,
    jit_solve,
    run_loop,
)
from .._misc import is_param
from .base import AbstractLeastSquaresSolver, Options
from .common import make_strictly_feasible, Problem
from .trf import TrustRegionReflective


_ADJOINTS = ("implicit", "unrolled")


class _Residuals(eqx.Module):
    """`fn` as a function of the flat vector `x` of `y0`'s inexact leaves:
    `x -> (flat residuals, aux)`; `tree(x)` gives the residuals as `fn` returns
    them."""

    fn: Callable
    y_like: PyTree
    y_static: PyTree
    args: PyTree
    has_aux: bool = eqx.field(static=True)

    def y(self, x):
        return eqx.combine(ravel_pytree(self.y_like)[1](x), self.y_static)

    def tree(self, x):
        out = self.fn(self.y(x), self.args)
        if self.has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise ValueError(
                    "eqxopt.least_squares: with `has_aux=True`, `fn` must return a "
                    "pair `(residuals, aux)`."
                )
            r, aux = out
        else:
            r, aux = out, None
        leaves = jtu.tree_leaves_with_path(r)
        for path, leaf in leaves:
            if not eqx.is_array_like(leaf) or isinstance(leaf, (str, bytes)):
                raise ValueError(
                    "eqxopt.least_squares: `fn` must return the residuals as a PyTree "
                    f"of arrays; `residuals{jtu.keystr(path)}` is a "
                    f"{type(leaf).__name__}."
                    + (
                        ""
                        if self.has_aux
                        else " If it returns `(residuals, aux)`, pass `has_aux=True`."
                    )
                )
            dtype = jnp.result_type(leaf)
            if not jnp.issubdtype(dtype, jnp.floating):
                raise ValueError(
                    "eqxopt.least_squares: the residuals must be real floating-point "
                    f"arrays; `residuals{jtu.keystr(path)}` has dtype {dtype}."
                )
        if not leaves:
            raise ValueError("eqxopt.least_squares: `fn` returned no residuals.")
        if len(leaves) == 1 and jnp.ndim(leaves[0][1]) == 0:
            raise ValueError(
                "eqxopt.least_squares: `fn` returned a scalar; it must return the "
                "vector (or PyTree) of residuals `r`, whose cost `0.5 * sum(r**2)` is "
                "minimized, not the loss. For a scalar loss use `eqxopt.minimize`."
            )
        return r, aux

    def __call__(self, x):
        r, aux = self.tree(x)
        flat = jnp.concatenate([jnp.ravel(jnp.asarray(v)) for v in jtu.tree_leaves(r)])
        return flat.astype(x.dtype), aux


def _problem(inputs) -> Problem:
    residuals, solver, lower, upper, _, _ = inputs
    return Problem(residuals, solver.jac, lower, upper)


# `optx.internal.implicit_jvp` wants plain global functions.
@no_type_check
def _primal(inputs):
    residuals, solver, lower, upper, x0, options = inputs
    problem = _problem(inputs)
    r0, aux0 = problem.residuals(x0)
    J0, g0 = problem.jacobian_and_grad(x0, r0)
    cost0 = 0.5 * jnp.dot(r0, r0)
    finite0 = jnp.all(jnp.isfinite(r0)) & jnp.all(jnp.isfinite(g0))
    if J0 is not None:
        finite0 = finite0 & jnp.all(jnp.isfinite(J0))
    one = jnp.ones((), jnp.int32)
    false = jnp.zeros((), bool)
    carry = Carry.start(
        x0,
        cost0,
        g0,
        aux0,
        None,
        converged=false,
        finite=finite0,
        r=r0,
        J=J0,
        num_jevals=one,
    )
    carry = solver.start(problem, carry, options)
    carry, history = run_loop(
        lambda carry: solver.iterate(problem, carry, options),
        carry,
        max_steps=options.max_steps,
        differentiable=options.differentiable,
        progress="least_squares" if options.progress else None,
    )
    stats = {
        "num_steps": carry.num_steps,
        "num_fevals": carry.num_fevals,
        "num_jevals": carry.num_jevals,
        "history": history,
    }
    return carry.y, (
        carry.f,
        carry.aux,
        carry.J,
        carry.state,
        carry.r,
        carry.result,
        stats,
    )


@no_type_check
def _rewrite(x, residual, inputs):
    """The optimality condition: the gradient of the cost is zero, or with bounds
    `x - P(x - g) = 0` (the active variables' rows are the identity)."""
    residuals, _, lower, upper, _, _ = inputs
    g = jax.grad(lambda x: 0.5 * jnp.sum(residuals(x)[0] ** 2))(x)
    if lower is None:
        return g
    return x - jnp.clip(x - g, lower, upper)


def _unflatten_like(shapes, flat):
    """`flat` split into the leaves of `shapes` (a PyTree of `ShapeDtypeStruct`s)."""
    leaves, treedef = jtu.tree_flatten(shapes)
    out, start = [], 0
    for leaf in leaves:
        size = int(np.prod(leaf.shape))
        out.append(flat[start : start + size].reshape(leaf.shape).astype(leaf.dtype))
        start += size
    return jtu.tree_unflatten(treedef, out)


@eqx.filter_custom_jvp
def _at_solution(x, residuals, out):
    """`out` (the residuals and aux at `x`, from the loop), differentiable as
    `residuals.tree(x)` is."""
    return out


@_at_solution.def_jvp
def _at_solution_jvp(primals, tangents):
    x, residuals, out = primals
    tx, t_residuals, _ = tangents
    if tx is None:
        tx = jnp.zeros_like(x)
    _, t_out = eqx.filter_jvp(
        lambda x, res: res.tree(x), (x, residuals), (tx, t_residuals)
    )
    return out, t_out


def _solve(fn, solver, y0, args, bounds, options, throw_inside, adjoint):
    y_dyn, y_static = eqx.partition(y0, is_param)
    x0, _ = ravel_pytree(y_dyn)
    residuals = _Residuals(fn, y_dyn, y_static, args, options.has_aux)
    if bounds is None:
        lower = upper = None
    else:
        lo_tree, up_tree = broadcast_bounds(bounds, y_dyn, what="bounds")
        lower = ravel_pytree(lo_tree)[0].astype(x0.dtype)
        upper = ravel_pytree(up_tree)[0].astype(x0.dtype)
        if throw_inside:
            bad = jnp.any(lower > upper) | jnp.any(jnp.isnan(lower) | jnp.isnan(upper))
            x0 = eqx.error_if(
                x0,
                bad,
                "eqxopt.least_squares: `bounds`: lower > upper or a NaN bound (a box "
                "needs lower <= upper; an open side is None or +-inf).",
            )
        x0 = jnp.clip(x0, lower, upper)
        x0 = make_strictly_feasible(x0, lower, upper, rstep=1e-10)
    inputs = (residuals, solver, lower, upper, x0, options)
    tags = frozenset({lx.symmetric_tag}) if bounds is None else frozenset()
    x, (cost, aux, J, state, r_flat, result, stats) = adjoint.solve(
        _primal, _rewrite, inputs, tags
    )
    # The residuals, cost and aux at the solution are the loop's (no new evaluation
    # of `fn`); their derivatives are those of `fn` at the solution.
    r_tree = _unflatten_like(jax.eval_shape(lambda x: residuals.tree(x)[0], x0), r_flat)
    r, aux = _at_solution(x, residuals, (r_tree, aux))
    cost = 0.5 * jnp.sum(jnp.square(ravel_pytree(r)[0].astype(x.dtype)))
    sol = Solution(
        value=residuals.y(x),
        loss=cost,
        aux=aux,
        state=state,
        result=result,
        stats=stats,
        residuals=r,
        jac=J,
    )
    if throw_inside:
        sol = error_if_failed(sol, result, "eqxopt.least_squares")
    return sol


def _check_y0(y0):
    leaves = [x for x in jtu.tree_leaves(y0) if is_param(x)]
    if not leaves:
        raise ValueError(
            "eqxopt.least_squares: `y0` has no floating-point JAX or NumPy array to "
            "fit (only its inexact arrays are fitted). Pass e.g. "
            "`jnp.asarray(y0, float)`."
        )


def least_squares(
    fn: Callable[[PyTree, Any], Any],
    solver: AbstractLeastSquaresSolver | None,
    y0: PyTree,
    args: PyTree = None,
    *,
    bounds: tuple[Any, Any] | None = None,
    max_steps: int = 256,
    ftol: float = 1e-8,
    xtol: float = 1e-8,
    gtol: float = 1e-8,
    has_aux: bool = False,
    throw: bool = True,
    progress: bool = False,
    adjoint: str = "implicit",
) -> Solution:
    r"""Minimize the cost $\tfrac12 \sum_i r_i(y, \text{args})^2$ of the residuals
    `fn(y, args)` over `y`, from `y0`: SciPy's `least_squares`, compiled, batched
    under `vmap` and differentiable.

    The solver is [`eqxopt.TrustRegionReflective`][] (SciPy's `method="trf"`, with
    bounds; the default) or [`eqxopt.LevenbergMarquardt`][] (MINPACK's `lmder`,
    SciPy's `method="lm"`). The solve is one bounded loop of at most `max_steps`
    outer iterations; each makes trial steps, shrinking the trust region, until one
    decreases the cost (it is accepted and counted in `num_steps`) or a convergence
    test holds. The solve is compiled once per `fn`, solver and input shapes (as
    `equinox.filter_jit`).

    **Arguments:**

    - `fn`: the residuals, `fn(y, args) -> residuals` (any PyTree of real arrays;
        they are flattened in `ravel_pytree`'s order), or `-> (residuals, aux)` with
        `has_aux=True`.
    - `solver`: [`eqxopt.TrustRegionReflective`][] or
        [`eqxopt.LevenbergMarquardt`][]; `None` means `TrustRegionReflective()`.
    - `y0`: the starting point, any PyTree; only its inexact arrays are fitted
        (flattened in `jax.flatten_util.ravel_pytree`'s order).
    - `args`: passed to `fn` unchanged; the solution is differentiable with respect
        to it (see `adjoint`).
    - `bounds`: `None`, or `(lower, upper)`, each a PyTree prefix of `y0` (a scalar
        bounds every element; `None` or $\pm\infty$ leaves a side open), as in
        [`eqxopt.minimize`][]. `y0` is projected into the box and moved strictly
        inside it (SciPy's `make_strictly_feasible`); every iterate stays strictly
        inside. `lower > upper` or a NaN bound raises a `ValueError`.
        [`eqxopt.LevenbergMarquardt`][] takes no bounds (a `ValueError`).
    - `max_steps`: the most outer iterations (accepted steps).
    - `ftol`, `xtol`, `gtol`: SciPy's three convergence tests, with the solver's
        definitions (SciPy's `trf` or MINPACK's, see each solver); the solve is
        successful when any holds.
    - `has_aux`: whether `fn` returns `(residuals, aux)`.
    - `throw`: raise an error naming the result when it is not
        `RESULTS.successful`; with `False`, check `sol.result`.
    - `progress`: a live progress bar (step, cost) on stderr.
    - `adjoint`: `"implicit"` (default) differentiates the solution with respect to
        `args` by the implicit function theorem at the optimum (the gradient of the
        cost is zero; with bounds, the projected gradient), solved with lineax;
        `"unrolled"` differentiates through the loop.

    **Returns:**

    An [`eqxopt.Solution`][]: `value`, `loss` (the cost), `aux`, `residuals`, `jac`
    (the dense Jacobian at `value`, `None` with `jac="matrix-free"`), `state` (the
    solver's final trust-region state), `result` and `stats` (`num_steps`: accepted
    steps; `num_fevals`: calls of `fn`, rejected trial points included, and the
    evaluation at `value` that returns `residuals`; `num_jevals`: Jacobian
    evaluations; `history`: the cost at the start of each outer iteration). A
    non-finite residual at `y0` ends with `RESULTS.nonfinite`. Under `jax.vmap` each
    lane has its own result and counts.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        def residuals(y, args):
            t, data = args
            return y["a"] * jnp.exp(-y["k"] * t) - data


        t = jnp.linspace(0.0, 4.0, 20)
        data = 3.0 * jnp.exp(-1.5 * t)
        y0 = {"a": jnp.array(1.0), "k": jnp.array(0.5)}
        sol = eqxopt.least_squares(
            residuals, None, y0, (t, data), bounds=({"a": None, "k": 0.0}, None)
        )
        sol.value  # {"a": 3.0, "k": 1.5}
        ```
    """
    if solver is None:
        solver = TrustRegionReflective()
    check_solver(
        "eqxopt.least_squares",
        "solver",
        solver,
        ("residuals",),
        "`eqxopt.TrustRegionReflective()`, `eqxopt.LevenbergMarquardt()` or None",
        bounds=bounds,
        y0=y0,
    )
    check_options(
        "eqxopt.least_squares",
        max_steps,
        adjoint,
        _ADJOINTS,
        ftol=ftol,
        xtol=xtol,
        gtol=gtol,
    )
    _check_y0(y0)
    if bounds is not None:
        check_bounds(bounds, eqx.filter(y0, is_param))
    options = Options(
        int(max_steps),
        float(ftol),
        float(xtol),
        float(gtol),
        bool(has_aux),
        bool(progress),
    )
    return jit_solve(
        "eqxopt.least_squares",
        "solver",
        _solve,
        (fn, solver, y0, args, bounds),
        options,
        bool(throw),
        ADJOINTS[adjoint],
    )
