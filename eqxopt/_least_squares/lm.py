"""`LevenbergMarquardt`: MINPACK's `lmder`, SciPy's `least_squares(method="lm")`."""

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
import numpy as np
from jaxtyping import Array

from .._minimize.loop import while_loop
from .._minimize.solve import Carry
from .base import AbstractLeastSquaresSolver, MAX_TRIALS, next_carry, Options
from .common import (
    check_solver_options,
    is_tall,
    norm,
    phi_and_derivative,
    Problem,
    reduce_tall,
    safe_div,
    safe_sqrt,
)


# MINPACK's constants: the initial step bound is `_FACTOR |diag * x0|`.
_FACTOR = 100.0


class LMState(eqx.Module):
    """MINPACK's step bound `delta`, Levenberg-Marquardt parameter `par`, variable
    scaling `diag` and `xnorm = |diag * x|`; `first`: no step accepted yet."""

    delta: Any
    par: Any
    diag: Any
    xnorm: Any
    first: Any


def _newton_par(par, parl, paru, fp, dxnorm, dphi, delta, it):
    """One iteration of `lmpar`'s safeguarded Newton method on `par`, from the
    scaled step's length `dxnorm` at `par` and the derivative `dphi` of that length
    in `par`: `(par, parl, paru, fp, stop)`, the next parameter, its bounds,
    `fp = dxnorm - delta` and whether to stop (the length is within 10% of `delta`;
    or the lower bound is 0 and `fp`, negative, stopped decreasing; or the tenth
    iteration)."""
    fp_new = dxnorm - delta
    stop = (
        (jnp.abs(fp_new) <= 0.1 * delta)
        | ((parl == 0) & (fp_new <= fp) & (fp < 0))
        | (it == 9)
    )
    parc = safe_div(-fp_new * dxnorm, delta * dphi)
    parl = jnp.where(fp_new > 0, jnp.maximum(parl, par), parl)
    paru = jnp.where(fp_new < 0, jnp.minimum(paru, par), paru)
    par = jnp.where(stop, par, jnp.maximum(parl, par + parc))
    return par, parl, paru, fp_new, stop


def lmpar(m, n, uf, s, V, delta, par0):
    """MINPACK's `lmpar` in the scaled variables `z = diag * p`, through the SVD
    `J diag^{-1} = U diag(s) V^T` (`uf = U^T r`): the Gauss-Newton step when
    `|z| <= 1.1 delta`, else the step for the parameter `par` found by Moré's
    safeguarded Newton iteration (at most 10 iterations, `| |z| - delta | <=
    0.1 delta`), started from `par0`. Returns `(z, par)`."""
    dtype = uf.dtype
    tiny = jnp.finfo(dtype).tiny
    eps = jnp.finfo(dtype).eps
    keep = s > eps * max(m, n) * s[0]
    full = keep[-1] if m >= n else jnp.zeros((), bool)
    s_safe = jnp.where(keep, s, 1)
    suf = s * uf
    z_gn = -V @ jnp.where(keep, uf / s_safe, 0)
    dxnorm = norm(z_gn)
    fp = dxnorm - delta
    gn = fp <= 0.1 * delta
    _, dphi0 = phi_and_derivative(jnp.zeros_like(delta), suf, s_safe, delta)
    parl = jnp.where(full, safe_div(-fp * dxnorm, delta * dphi0), 0)
    parl = jnp.where(jnp.isfinite(parl), parl, 0)
    gnorm = norm(suf)
    paru = safe_div(gnorm, delta)
    paru = jnp.where(paru == 0, tiny / jnp.minimum(delta, 0.1), paru)
    par = jnp.minimum(jnp.maximum(par0, parl), paru)
    par = jnp.where(par == 0, safe_div(gnorm, dxnorm), par)

    def z_of(par):
        return -V @ safe_div(suf, s**2 + par)

    def body(it, c):
        par, parl, paru, fp, done = c
        par = jnp.where(par == 0, jnp.maximum(tiny, 0.001 * paru), par)
        dxnorm = norm(z_of(par))
        _, dphi = phi_and_derivative(par, suf, s, delta)
        par_new, parl_new, paru_new, fp_new, stop = _newton_par(
            par, parl, paru, fp, dxnorm, dphi, delta, it
        )
        upd = lambda old, new: jnp.where(done, old, new)
        return (
            upd(c[0], par_new),
            upd(parl, parl_new),
            upd(paru, paru_new),
            upd(fp, fp_new),
            done | stop,
        )

    init = (par, parl, paru, fp, gn)
    par, _, _, _, _ = lax.fori_loop(0, 10, body, init)
    par = jnp.where(gn, 0, par)
    z = jnp.where(gn, z_gn, z_of(par))
    return z, par


def lmpar_matrix_free(Jmv, Jtv, f, delta, par0):
    """`lmpar` on Jacobian products (`jac="matrix-free"`): the same safeguarded Newton
    iteration on `par` in the scaled variables, with `Jmv(z) = J D^{-1} z` and
    `Jtv(u) = D^{-1} J^T u`. The step for a given `par` solves
    `(A + par I) z = -Jtv(f)`, `A = (J D^{-1})^T J D^{-1}`, by conjugate gradients,
    and `phi'(par) = -z^T (A + par I)^{-1} z / |z|` by a second solve. The
    Gauss-Newton step is CG's from zero at `par = 0` (the least-norm solution);
    rank is not known, so the iteration's lower bound starts at 0 (MINPACK's
    rank-deficient case). Returns `(z, par)`."""
    dtype = f.dtype
    n = Jtv(f).size
    tiny = jnp.finfo(dtype).tiny
    # CG to about sqrt(eps) / 100 relative: 1.5e-10 in float64, 3.5e-6 in float32.
    rtol = float(np.sqrt(np.finfo(dtype).eps)) * 1e-2
    cg = lx.CG(rtol=rtol, atol=0.0, max_steps=max(10, 2 * n))
    struct = jax.ShapeDtypeStruct((n,), dtype)

    def solve(par, rhs):
        op = lx.FunctionLinearOperator(
            lambda v: Jtv(Jmv(v)) + par * v, struct, lx.positive_semidefinite_tag
        )
        out = lx.linear_solve(op, rhs, cg, throw=False).value
        return jnp.where(jnp.all(jnp.isfinite(out)), out, 0)

    b = -Jtv(f)
    z_gn = solve(jnp.zeros((), dtype), b)
    dxnorm = norm(z_gn)
    fp = dxnorm - delta
    gn = fp <= 0.1 * delta
    gnorm = norm(b)
    paru = safe_div(gnorm, delta)
    paru = jnp.where(paru == 0, tiny / jnp.minimum(delta, 0.1), paru)
    parl = jnp.zeros_like(delta)
    par = jnp.minimum(jnp.maximum(par0, parl), paru)
    par = jnp.where(par == 0, safe_div(gnorm, dxnorm), par)

    def cond(c):
        return ~c[5]

    def body(c):
        par, parl, paru, fp, it, _, _ = c
        par = jnp.where(par == 0, jnp.maximum(tiny, 0.001 * paru), par)
        z = solve(par, b)
        dxnorm = norm(z)
        w = solve(par, z)
        dphi = safe_div(-jnp.dot(z, w), dxnorm)
        par_new, parl_new, paru_new, fp_new, stop = _newton_par(
            par, parl, paru, fp, dxnorm, dphi, delta, it
        )
        return par_new, parl_new, paru_new, fp_new, it + 1, stop, z

    init = (par, parl, paru, fp, jnp.asarray(0, jnp.int32), gn, z_gn)
    par, _, _, _, _, _, z = while_loop(cond, body, init, max_steps=10)
    par = jnp.where(gn, 0, par)
    z = jnp.where(gn, z_gn, z)
    return z, par


def _gnorm(J, f, colnorm):
    """MINPACK's scaled gradient test quantity: `max_j |J_j^T f| / (|J_j| |f|)`."""
    fnorm = norm(f)
    # Through the QR factors, as MINPACK (`R^T Q^T f`): with a nearly singular `J`
    # and tiny residuals this rounds as `lmder` does, where `J^T f` would not.
    Q, R = jnp.linalg.qr(J)
    Jtf = R.T @ (Q.T @ f)
    safe = jnp.where(colnorm > 0, colnorm, 1) * jnp.where(fnorm > 0, fnorm, 1)
    ratio = jnp.where(colnorm > 0, jnp.abs(Jtf) / safe, 0)
    return jnp.where(fnorm > 0, jnp.max(ratio), 0)


class LevenbergMarquardt(AbstractLeastSquaresSolver):
    r"""The Levenberg-Marquardt method of MINPACK's `lmder` (SciPy's
    `least_squares(method="lm")`), without bounds.

    Each iteration finds the step $p$ minimizing $|J p + r|$ subject to
    $|D p| \le \Delta$ (MINPACK's `lmpar`: the Levenberg-Marquardt parameter by
    Moré's safeguarded Newton iteration, here through an SVD of $J D^{-1}$; with
    `jac="matrix-free"`, by conjugate gradients on the damped normal equations
    $(D^{-1} J^T J D^{-1} + \lambda I) z = -D^{-1} J^T r$ from Jacobian products), and
    updates the bound $\Delta$ from the ratio of actual to predicted reduction as
    `lmder` does; a step is accepted when that ratio is at least $10^{-4}$.
    $D = 1/x_\text{scale}$, or with `x_scale="jac"` the Jacobian's column norms
    (never decreasing; MINPACK's `mode=1`).

    Converged when MINPACK's tests hold: `ftol` on the actual and predicted relative
    reductions of the sum of squares, `xtol` on $\Delta \le x_{tol} |D x|$, `gtol` on
    the largest cosine between $r$ and a column of $J$ (matrix-free: SciPy `trf`'s
    $\max |D^{-1} J^T r| < g_{tol}$). Bounds raise a
    `ValueError` (use [`eqxopt.TrustRegionReflective`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        def rosenbrock(y, args):
            return jnp.stack([10 * (y[1] - y[0] ** 2), 1 - y[0]])


        sol = eqxopt.least_squares(
            rosenbrock, eqxopt.LevenbergMarquardt(), jnp.array([-1.2, 1.0])
        )
        assert jnp.allclose(sol.value, 1.0, atol=1e-6)
        ```

    ??? cite "References"

        ```bibtex
        @inproceedings{more1978levenberg,
            title={The {L}evenberg-{M}arquardt algorithm: implementation and theory},
            author={Mor{\'e}, Jorge J.}, booktitle={Numerical Analysis},
            series={Lecture Notes in Mathematics}, volume={630}, pages={105--116},
            publisher={Springer}, year={1978}}
        ```
    """

    jac: str = eqx.field(default="auto", static=True)
    x_scale: Any = 1.0

    refuses_bounds = (
        "MINPACK's method is unconstrained; use `eqxopt.TrustRegionReflective()`"
    )

    def __check_init__(self):
        check_solver_options("LevenbergMarquardt", self.jac, self.x_scale)

    def _colnorm(self, J):
        return jnp.sqrt(jnp.sum(J * J, axis=0))

    def _gtol_ok(self, J, f, g, diag, gtol):
        """MINPACK's `gtol` test; matrix-free (no column norms of `J`), SciPy
        `trf`'s on the scaled gradient: `max |g / diag| < gtol`."""
        if J is None:
            return jnp.max(jnp.abs(g / diag)) < gtol
        return _gnorm(J, f, self._colnorm(J)) <= gtol

    def start(self, problem: Problem, carry: Carry, options: Options) -> Carry:
        x, J = carry.y, carry.J
        if isinstance(self.x_scale, str):
            assert J is not None
            colnorm = self._colnorm(J)
            diag = jnp.where(colnorm == 0, 1, colnorm)
        else:
            diag = 1 / jnp.broadcast_to(jnp.asarray(self.x_scale, x.dtype), x.shape)
        xnorm = norm(diag * x)
        delta = jnp.where(xnorm == 0, _FACTOR, _FACTOR * xnorm).astype(x.dtype)
        state = LMState(delta, jnp.zeros_like(delta), diag, xnorm, jnp.ones((), bool))
        assert carry.r is not None
        converged = self._gtol_ok(J, carry.r, carry.g, diag, options.gtol)
        return dataclasses.replace(carry, state=state, converged=converged)

    def iterate(self, problem: Problem, carry: Carry, options: Options) -> Carry:
        x, f, J, cost = carry.y, carry.r, carry.J, carry.f
        assert f is not None  # (a least-squares carry)
        state: LMState = carry.state
        n, m = x.size, f.size
        diag = state.diag
        if J is None:
            _, jvp = problem.linearize(x)
            _, vjp, _ = jax.vjp(problem.fn, x, has_aux=True)
            Jp = jvp
            step = lambda delta, par: lmpar_matrix_free(
                lambda z: jvp(z / diag), lambda u: vjp(u)[0] / diag, f, delta, par
            )
        else:
            if isinstance(self.x_scale, str):
                diag = jnp.maximum(diag, self._colnorm(J))
            Jd, fd = J / diag, f
            if is_tall(m, n):
                Jd, fd = reduce_tall(Jd, f)
            U, s, Vt = jnp.linalg.svd(Jd, full_matrices=False)
            uf = U.T @ fd
            V = Vt.T
            J_: Array = J
            Jp = lambda p: J_ @ p
            step = lambda delta, par: lmpar(m, n, uf, s, V, delta, par)
        fnorm = norm(f)

        def trial(c):
            delta, par, xnorm, first, _, _, _, _, _, nfev, trials = c
            z, par = step(delta, par)
            p = z / diag
            pnorm = norm(z)
            delta = jnp.where(first, jnp.minimum(delta, pnorm), delta)
            x_new = x + p
            f_new, aux_new = problem.residuals(x_new)
            fnorm1 = norm(f_new)
            actred = jnp.where(
                0.1 * fnorm1 < fnorm, 1 - safe_div(fnorm1, fnorm) ** 2, -1.0
            )
            temp1 = safe_div(norm(Jp(p)), fnorm)
            temp2 = safe_div(safe_sqrt(par) * pnorm, fnorm)
            prered = temp1**2 + temp2**2 / 0.5
            dirder = -(temp1**2 + temp2**2)
            ratio = jnp.where(
                prered != 0, actred / jnp.where(prered != 0, prered, 1), 0
            )
            temp = jnp.where(
                actred >= 0, 0.5, safe_div(0.5 * dirder, dirder + 0.5 * actred)
            )
            temp = jnp.where((0.1 * fnorm1 >= fnorm) | (temp < 0.1), 0.1, temp)
            poor = ratio <= 0.25
            good = ~poor & ((par == 0) | (ratio >= 0.75))
            delta = jnp.where(
                poor,
                temp * jnp.minimum(delta, pnorm / 0.1),
                jnp.where(good, pnorm / 0.5, delta),
            )
            par = jnp.where(poor, par / temp, jnp.where(good, 0.5 * par, par))
            success = ratio >= 1e-4
            xnorm = jnp.where(success, norm(diag * x_new), xnorm)
            ftol_ok = (
                (jnp.abs(actred) <= options.ftol)
                & (prered <= options.ftol)
                & (0.5 * ratio <= 1)
            )
            xtol_ok = delta <= options.xtol * xnorm
            return (
                delta,
                par,
                xnorm,
                first & ~success,
                success,
                ftol_ok | xtol_ok,
                x_new,
                (f_new, aux_new),
                0.5 * fnorm1**2,
                nfev + 1,
                trials + 1,
            )

        def cond(c):
            success, term, trials = c[4], c[5], c[10]
            return ~success & ~term & (trials < MAX_TRIALS)

        false = jnp.zeros((), bool)
        init = (
            state.delta,
            state.par,
            state.xnorm,
            state.first,
            false,
            false,
            x,
            (f, carry.aux),
            cost,
            carry.num_fevals,
            jnp.asarray(0, jnp.int32),
        )
        out = while_loop(cond, trial, init, max_steps=MAX_TRIALS)
        delta, par, xnorm, first, success, term, x_new, (f_new, aux_new) = out[:8]
        cost_new, nfev = out[8], out[9]
        pick = lambda new, old: jnp.where(success, new, old)
        x = pick(x_new, x)
        f = pick(f_new, f)
        J_new, g_new = problem.jacobian_and_grad(x, f)
        J = None if J is None or J_new is None else pick(J_new, J)
        g = pick(g_new, carry.g)
        aux = jtu.tree_map(pick, aux_new, carry.aux)
        cost = pick(cost_new, cost)
        gtol_ok = self._gtol_ok(J, f, g, diag, options.gtol)
        return next_carry(
            carry,
            success,
            y=x,
            r=f,
            aux=aux,
            J=J,
            g=g,
            f=cost,
            state=LMState(delta, par, diag, xnorm, first),
            num_fevals=nfev,
            converged=term | gtol_ok,
            stalled=~success & ~term,
        )


LevenbergMarquardt.__init__.__doc__ = r"""**Arguments:**

- `jac`: how the Jacobian is computed: `"auto"` (forward mode when there are no more
    parameters than residuals, else reverse mode), `"fwd"`, `"rev"`, or
    `"matrix-free"` (Jacobian products only: each step for a given
    Levenberg-Marquardt parameter is a conjugate-gradient solve of the damped normal
    equations, and the `gtol` test is SciPy `trf`'s, `max |g x_scale| < gtol`, as
    the Jacobian's column norms are not known; `x_scale="jac"` raises a
    `ValueError`). (Static.)
- `x_scale`: the inverse of MINPACK's `diag`: a positive number or an array over
    `ravel_pytree(y0)`'s order, or `"jac"` (MINPACK's `mode=1`: `diag` is the
    Jacobian's column norms, never decreasing). Default `1.0` (SciPy's default for
    `method="lm"` is `"jac"` since SciPy 1.16; pass `x_scale="jac"` to match it).
"""
