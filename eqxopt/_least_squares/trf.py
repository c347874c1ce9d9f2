"""`TrustRegionReflective`: SciPy's `least_squares(method="trf")`."""

import dataclasses
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu

from .._minimize.loop import while_loop
from .._minimize.solve import Carry
from .base import AbstractLeastSquaresSolver, MAX_TRIALS, next_carry, Options
from .common import (
    check_solver_options,
    check_termination,
    cl_scaling,
    evaluate_quadratic,
    is_tall,
    jac_scale,
    make_strictly_feasible,
    norm,
    Problem,
    reduce_tall,
    safe_div,
    safe_sqrt,
    select_step,
    solve_lsq_trust_region,
    solve_trust_region_2d,
    update_tr_radius,
)


class TRFState(eqx.Module):
    """The trust-region radius `Delta` (in the scaled variables), the last
    Levenberg-Marquardt parameter `alpha` (the next subproblem's first guess) and the
    inverse variable scale."""

    Delta: Any
    alpha: Any
    scale_inv: Any


class TrustRegionReflective(AbstractLeastSquaresSolver):
    r"""The trust-region reflective method of SciPy's
    `least_squares(method="trf")`, with bounds.

    Each iteration solves the trust-region subproblem
    $\min_p |J p + r|^2$ subject to $|D^{-1} p| \le \Delta$ exactly through an SVD of
    the (scaled) Jacobian, with Moré's iteration on the Levenberg-Marquardt
    parameter. With bounds the variables are scaled by Coleman and Li's vector
    $v$ (the distance to the bound the gradient points to), the subproblem is
    augmented by $\mathrm{diag}(g\,\partial v)$, and the step is the best of the
    trust-region step cut back inside the box, its reflection at the first bound
    it hits, and the scaled gradient step, each kept strictly inside by
    $\theta = \max(0.995, 1 - |g v|_\infty)$. The radius grows by 2 after a very
    successful step on its boundary and shrinks to a quarter of the step after a
    poor one (SciPy's `update_tr_radius`). With `jac="matrix-free"` the subproblem is
    solved in the two-dimensional subspace of the scaled gradient and a regularized
    Gauss-Newton step from conjugate gradients on Jacobian products (SciPy's
    `tr_solver="lsmr"` scheme).

    Converged when SciPy's `trf` tests hold: `gtol` on $|g v|_\infty$ (the
    projected, scaled gradient; $|g|_\infty$ without bounds), `ftol` on the cost's
    relative reduction with a ratio above 1/4, `xtol` on $|\Delta x| < x_{tol}
    (x_{tol} + |x|)$.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        t = jnp.linspace(0.0, 4.0, 40)
        y = 2.0 * jnp.exp(-0.7 * t)


        def residuals(p, args):
            return p["a"] * jnp.exp(-p["k"] * t) - y


        # The rate k is kept non-negative by a bound.
        sol = eqxopt.least_squares(
            residuals,
            eqxopt.TrustRegionReflective(),
            {"a": jnp.array(1.0), "k": jnp.array(1.0)},
            bounds=({"a": -jnp.inf, "k": 0.0}, jnp.inf),
        )
        assert jnp.allclose(sol.value["k"], 0.7, atol=1e-4)
        ```

    ??? cite "References"

        ```bibtex
        @article{branch1999subspace,
            title={A Subspace, Interior, and Conjugate Gradient Method for
                   Large-Scale Bound-Constrained Minimization Problems},
            author={Branch, Mary Ann and Coleman, Thomas F. and Li, Yuying},
            journal={SIAM Journal on Scientific Computing}, volume={21}, number={1},
            pages={1--23}, year={1999}}
        ```
    """

    jac: str = eqx.field(default="auto", static=True)
    x_scale: Any = 1.0

    def __check_init__(self):
        check_solver_options("TrustRegionReflective", self.jac, self.x_scale)

    bounds_aware = True

    def _scaled_gnorm(self, problem: Problem, x, g):
        if problem.lower is None:
            return jnp.max(jnp.abs(g))
        v, _ = cl_scaling(x, g, problem.lower, problem.upper)
        return jnp.max(jnp.abs(g * v))

    def start(self, problem: Problem, carry: Carry, options: Options) -> Carry:
        x, g = carry.y, carry.g
        if isinstance(self.x_scale, str):
            scale_inv = jac_scale(carry.J)
        else:
            scale_inv = 1 / jnp.broadcast_to(
                jnp.asarray(self.x_scale, x.dtype), x.shape
            )
        if problem.lower is None:
            Delta = norm(x * scale_inv)
        else:
            v, dv = cl_scaling(x, g, problem.lower, problem.upper)
            v = jnp.where(dv != 0, v * scale_inv, v)
            Delta = norm(x * scale_inv / jnp.sqrt(v))
        Delta = jnp.where(Delta == 0, 1.0, Delta).astype(x.dtype)
        state = TRFState(Delta, jnp.zeros_like(Delta), scale_inv)
        converged = self._scaled_gnorm(problem, x, g) < options.gtol
        return dataclasses.replace(carry, state=state, converged=converged)

    def iterate(self, problem: Problem, carry: Carry, options: Options) -> Carry:
        x, f, J, g, cost = carry.y, carry.r, carry.J, carry.g, carry.f
        assert f is not None  # (a least-squares carry)
        state: TRFState = carry.state
        scale_inv = state.scale_inv
        scale = 1 / scale_inv
        n, m = x.size, f.size
        lb, ub = problem.lower, problem.upper
        bounded = lb is not None
        dtype = x.dtype
        if bounded:
            assert ub is not None
            v, dv = cl_scaling(x, g, lb, ub)
            g_norm = jnp.max(jnp.abs(g * v))
            v = jnp.where(dv != 0, v * scale_inv, v)
            d = jnp.sqrt(v) * scale
            diag_h = g * dv * scale
            theta = jnp.maximum(0.995, 1 - g_norm)
        else:
            d = scale
            diag_h = None
            theta = None
        g_h = d * g
        if J is None:
            _, jvp = problem.linearize(x)
            Jmv = lambda s: jvp(d * s)
            S, B, g_S = problem.subspace_solver(x, d, g_h, diag_h, f)(state.Delta)
            solve = lambda Delta, alpha: (
                S @ solve_trust_region_2d(B, g_S, Delta),
                alpha,
            )
        else:
            J_h = J * d
            if is_tall(m, n):
                J_h, f_h = reduce_tall(J_h, f)
            else:
                f_h = f
            Jmv = lambda s: J_h @ s
            if bounded:
                assert diag_h is not None
                A = jnp.concatenate([J_h, jnp.diag(safe_sqrt(diag_h))])
                rhs = jnp.concatenate([f_h, jnp.zeros(n, dtype)])
            else:
                A, rhs = J_h, f_h
            U, s, Vt = jnp.linalg.svd(A, full_matrices=False)
            uf = U.T @ rhs
            V = Vt.T
            solve = lambda Delta, alpha: solve_lsq_trust_region(
                m, n, uf, s, V, Delta, alpha
            )
        x_norm = norm(x)

        def trial(c):
            Delta, alpha, actual, _, _, _, _, nfev, trials, _ = c
            p_h, alpha = solve(Delta, alpha)
            if bounded:
                assert lb is not None and ub is not None
                p = d * p_h
                step, step_h, predicted = select_step(
                    x, Jmv, diag_h, g_h, p, p_h, d, Delta, lb, ub, theta
                )
                x_new = make_strictly_feasible(x + step, lb, ub, rstep=0)
            else:
                step_h = p_h
                predicted = -evaluate_quadratic(Jmv, g_h, step_h)
                step = d * step_h
                x_new = x + step
            f_new, aux_new = problem.residuals(x_new)
            step_h_norm = norm(step_h)
            finite = jnp.all(jnp.isfinite(f_new))
            cost_new = 0.5 * jnp.dot(f_new, f_new)
            new_actual = cost - cost_new
            Delta_new, ratio = update_tr_radius(
                Delta, new_actual, predicted, step_h_norm, step_h_norm > 0.95 * Delta
            )
            ftol_ok, xtol_ok = check_termination(
                new_actual, cost, norm(step), x_norm, ratio, options.ftol, options.xtol
            )
            term = finite & (ftol_ok | xtol_ok)
            go_on = finite & ~term
            alpha = jnp.where(go_on, safe_div(alpha * Delta, Delta_new), alpha)
            Delta = jnp.where(
                finite, jnp.where(term, Delta, Delta_new), 0.25 * step_h_norm
            )
            actual = jnp.where(finite, new_actual, actual)
            return (
                Delta,
                alpha,
                actual,
                x_new,
                (f_new, aux_new),
                cost_new,
                term,
                nfev + 1,
                trials + 1,
                jnp.zeros((), bool),
            )

        def cond(c):
            actual, term, trials = c[2], c[6], c[8]
            return (actual <= 0) & ~term & (trials < MAX_TRIALS)

        int32 = lambda k: jnp.asarray(k, jnp.int32)
        init = (
            state.Delta,
            state.alpha,
            jnp.asarray(-1, dtype),
            x,
            (f, carry.aux),
            cost,
            jnp.zeros((), bool),
            carry.num_fevals,
            int32(0),
            jnp.zeros((), bool),
        )
        Delta, alpha, actual, x_new, (f_new, aux_new), cost_new, term, nfev, _, _ = (
            while_loop(cond, trial, init, max_steps=MAX_TRIALS)
        )
        accepted = actual > 0
        pick = lambda new, old: jnp.where(accepted, new, old)
        x = pick(x_new, x)
        f = pick(f_new, f)
        J_new, g_new = problem.jacobian_and_grad(x, f)
        aux = jtu.tree_map(pick, aux_new, carry.aux)
        cost = pick(cost_new, cost)
        J = None if J is None else pick(J_new, J)
        g = pick(g_new, g)
        if isinstance(self.x_scale, str):
            assert J is not None
            scale_inv = pick(jac_scale(J, scale_inv), scale_inv)
        converged = term | (self._scaled_gnorm(problem, x, g) < options.gtol)
        return next_carry(
            carry,
            accepted,
            y=x,
            r=f,
            aux=aux,
            J=J,
            g=g,
            f=cost,
            state=TRFState(Delta, alpha, scale_inv),
            num_fevals=nfev,
            converged=converged,
            stalled=~accepted & ~term,
        )


TrustRegionReflective.__init__.__doc__ = r"""**Arguments:**

- `jac`: how the Jacobian is computed: `"auto"` (forward mode when there are no more
    parameters than residuals, else reverse mode), `"fwd"`, `"rev"`, or
    `"matrix-free"` (Jacobian-vector and vector-Jacobian products only, never the
    matrix: for problems whose Jacobian does not fit in memory). (Static.)
- `x_scale`: SciPy's characteristic scale of each variable: a positive number or an
    array over `ravel_pytree(y0)`'s order (the trust region is a ball in `x /
    x_scale`), or `"jac"` (the inverse column norms of the Jacobian, never
    decreasing). Default `1.0`, SciPy's for `trf`.
"""
