"""The trust-region arithmetic shared by `TrustRegionReflective` and
`LevenbergMarquardt`, on flat vectors: the problem as the solvers see it
(`x -> residuals`, its Jacobian or Jacobian products), the trust-region subproblem
through an SVD, the reflective steps' one-dimensional quadratics and the bound
helpers, after SciPy's `scipy/optimize/_lsq/common.py` (the maths of Branch, Coleman
and Li's trust-region reflective method and of Moré's Levenberg-Marquardt
parameter). Every function is branch-free (`jnp.where`), so it runs under `vmap`."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import Array


JACS = ("auto", "fwd", "rev", "matrix-free")


def check_solver_options(name: str, jac: Any, x_scale: Any) -> None:
    """The checks of a solver's `jac` and `x_scale` (at construction)."""
    if not isinstance(jac, str) or jac not in JACS:
        raise ValueError(
            f"`{name}(jac=...)` must be one of 'auto', 'fwd', 'rev' or "
            f"'matrix-free', got {jac!r}."
        )
    if isinstance(x_scale, str):
        if x_scale == "jac" and jac == "matrix-free":
            raise ValueError(
                f"`{name}(x_scale='jac')` needs the Jacobian's column norms: it cannot "
                "be used with `jac='matrix-free'` (as in SciPy); pass numbers."
            )
        if x_scale != "jac":
            raise ValueError(
                f"`{name}(x_scale=...)` must be 'jac' or positive numbers, got "
                f"{x_scale!r}."
            )
    elif not isinstance(x_scale, Tracer):
        value = np.asarray(x_scale)
        if not (
            np.issubdtype(value.dtype, np.number)
            and np.all(np.isfinite(value))
            and np.all(value > 0)
        ):
            raise ValueError(
                f"`{name}(x_scale=...)` must be 'jac' or positive finite numbers, got "
                f"{x_scale!r}."
            )


class Problem(eqx.Module):
    """The residuals as a function of the flat parameter vector `x`: `fn(x)` returns
    `(r, aux)` with `r` a flat vector. `jac` is the solver's Jacobian mode; `lower`
    and `upper` the flat bounds (`None` without bounds)."""

    fn: Callable
    jac: str = eqx.field(static=True)
    lower: Array | None
    upper: Array | None

    def residuals(self, x):
        """`(r, aux)` at `x`."""
        return self.fn(x)

    def _mode(self, x):
        if self.jac != "auto":
            return self.jac
        r = jax.eval_shape(self.fn, x)[0]
        return "fwd" if x.size <= r.size else "rev"

    def jacobian_and_grad(self, x, r):
        """`(J, g)` at `x`, where the residuals are `r` (known: not evaluated again):
        the dense Jacobian (`None` when matrix-free) by forward or reverse mode, and
        the gradient `J^T r` of the cost."""
        mode = self._mode(x)
        if mode == "matrix-free":
            _, vjp, _ = jax.vjp(self.fn, x, has_aux=True)
            (g,) = vjp(r)
            return None, g
        if mode == "fwd":
            J, _ = jax.jacfwd(self.fn, has_aux=True)(x)
        else:
            _, vjp, _ = jax.vjp(self.fn, x, has_aux=True)
            (J,) = jax.vmap(vjp)(jnp.eye(r.size, dtype=r.dtype))
        return J, J.T @ r

    def linearize(self, x):
        """`(r, jvp)` at `x` (Jacobian products, for the matrix-free mode)."""
        r, jvp = jax.linearize(lambda x: self.fn(x)[0], x)
        return r, jvp

    def subspace_solver(self, x, d, g_h, diag_h, f):
        """For `jac="matrix-free"`: the trust-region step in the subspace spanned by
        the scaled gradient and a regularized Gauss-Newton step, found by conjugate
        gradients on the normal equations (SciPy's `tr_solver="lsmr"` scheme)."""
        return _subspace_solver(self, x, d, g_h, diag_h, f)


def norm(x):
    """The Euclidean norm, with a finite derivative at 0 (the unrolled adjoint
    differentiates every branch of a `jnp.where`)."""
    sq = jnp.sum(x * x)
    positive = sq > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1)), 0)


def safe_div(a, b):
    """`a / b`, and 0 where `b == 0`, with finite derivatives everywhere (the unused
    branch of a `jnp.where` must not be infinite: its zero cotangent times an infinite
    derivative is NaN, the double-`where` trick)."""
    nonzero = b != 0
    return jnp.where(nonzero, a / jnp.where(nonzero, b, 1), 0)


def safe_sqrt(x):
    """`sqrt(max(x, 0))`, with a zero (not infinite) derivative at 0."""
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1)), 0)


def cl_scaling(x, g, lower, upper):
    """Coleman and Li's scaling vector `v` and its derivative's sign `dv`."""
    one = jnp.ones_like(x)
    to_upper = (g < 0) & jnp.isfinite(upper)
    to_lower = (g > 0) & jnp.isfinite(lower)
    v = jnp.where(to_lower, x - lower, jnp.where(to_upper, upper - x, one))
    dv = jnp.where(to_lower, one, jnp.where(to_upper, -one, 0 * one))
    return v, dv


def jac_scale(J, scale_inv_old=None):
    """SciPy's `x_scale='jac'`: the inverse scale is the column norms of `J` (never
    decreasing; zero columns get 1 at the start)."""
    scale_inv = safe_sqrt(jnp.sum(J * J, axis=0))
    if scale_inv_old is None:
        scale_inv = jnp.where(scale_inv == 0, 1, scale_inv)
    else:
        scale_inv = jnp.maximum(scale_inv, scale_inv_old)
    return scale_inv


def phi_and_derivative(alpha, suf, s, Delta):
    """`phi(alpha) = |p(alpha)| - Delta` and its derivative, for the regularised
    least-squares step `p(alpha)` in the SVD's coordinates."""
    denom = s**2 + alpha
    p_norm = norm(safe_div(suf, denom))
    phi = p_norm - Delta
    phi_prime = safe_div(-jnp.sum(safe_div(suf**2, denom**3)), p_norm)
    return phi, phi_prime


def full_rank(s, m, n):
    """SciPy's rank test of the singular values `s` (descending) of an m x n matrix."""
    if m < n:
        return jnp.zeros((), bool)
    eps = jnp.finfo(s.dtype).eps
    return s[-1] > eps * m * s[0]


def solve_lsq_trust_region(m, n, uf, s, V, Delta, alpha0):
    """The solution of `min |J p + f|` subject to `|p| <= Delta`, given the SVD
    `J = U diag(s) V^T` and `uf = U^T f`: the Gauss-Newton step when it fits, else the
    step on the sphere with Moré's Newton iteration on `alpha` (at most 10 iterations,
    to a relative accuracy of 0.01; SciPy's `solve_lsq_trust_region`). Returns
    `(p, alpha)`."""
    rtol, max_iter = 0.01, 10
    suf = s * uf
    rank_ok = full_rank(s, m, n)
    s_safe = jnp.where(s > 0, s, 1)
    p_gn = -V @ jnp.where(s > 0, uf / s_safe, 0)
    gn = rank_ok & (norm(p_gn) <= Delta)
    upper = safe_div(norm(suf), Delta)
    phi0, dphi0 = phi_and_derivative(jnp.zeros_like(Delta), suf, s_safe, Delta)
    lower = jnp.where(rank_ok, safe_div(-phi0, dphi0), 0)
    guess = lambda lo, up: jnp.maximum(0.001 * up, safe_sqrt(lo * up))
    alpha = jnp.where(~rank_ok & (alpha0 == 0), guess(lower, upper), alpha0)

    def body(_, c):
        alpha, lower, upper, done = c
        reset = (alpha < lower) | (alpha > upper)
        a = jnp.where(reset, guess(lower, upper), alpha)
        phi, dphi = phi_and_derivative(a, suf, s, Delta)
        up = jnp.where(phi < 0, a, upper)
        ratio = safe_div(phi, dphi)
        lo = jnp.maximum(lower, a - ratio)
        a = a - safe_div((phi + Delta) * ratio, Delta)
        keep = lambda old, new: jnp.where(done, old, new)
        finished = done | (jnp.abs(phi) < rtol * Delta)
        return keep(alpha, a), keep(lower, lo), keep(upper, up), finished

    init = (alpha, lower, upper, jnp.zeros((), bool))
    alpha, _, _, _ = lax.fori_loop(0, max_iter, body, init)
    p = -V @ safe_div(suf, s**2 + alpha)
    p = p * safe_div(Delta, norm(p))
    p = jnp.where(gn, p_gn, p)
    return p, jnp.where(gn, 0, alpha)


def reduce_tall(J, f):
    """For a tall `J` (m > 2n): `(R, Q^T f)` from one Householder QR of `[J f]`
    (only its triangular factor is formed), with `J = Q R`. The least-squares
    subproblems in `J` are the same in `R` (`|J p + f|^2 = |R p + Q^T f|^2 + const`,
    the same singular values and right singular vectors, `|J s| = |R s|`), so the SVD
    and every later product are n x n, and no m x n factor is formed: about 2 m n^2
    flops where the SVD of `J` costs several times that."""
    n = J.shape[1]
    R = jnp.linalg.qr(jnp.concatenate([J, f[:, None]], axis=1), mode="r")
    return R[:n, :n], R[:n, n]


def is_tall(m: int, n: int) -> bool:
    """Whether `reduce_tall` pays (a static choice, by shape)."""
    return m > 2 * n


def update_tr_radius(Delta, actual, predicted, step_norm, bound_hit):
    """SciPy's `update_tr_radius`: `(Delta_new, ratio)`."""
    ratio = jnp.where(
        predicted > 0,
        actual / jnp.where(predicted > 0, predicted, 1),
        jnp.where((predicted == 0) & (actual == 0), 1.0, 0.0),
    ).astype(Delta.dtype)
    Delta = jnp.where(
        ratio < 0.25,
        0.25 * step_norm,
        jnp.where((ratio > 0.75) & bound_hit, 2.0 * Delta, Delta),
    )
    return Delta, ratio


def check_termination(dF, F, dx_norm, x_norm, ratio, ftol, xtol):
    """SciPy's `ftol` and `xtol` tests: `(ftol_ok, xtol_ok)`."""
    ftol_ok = (dF < ftol * F) & (ratio > 0.25)
    xtol_ok = dx_norm < xtol * (xtol + x_norm)
    return ftol_ok, xtol_ok


def evaluate_quadratic(Jmv, g, s, diag=None):
    """`0.5 s^T (J^T J + diag) s + g^T s`, with `Jmv(s) = J s`."""
    Js = Jmv(s)
    q = jnp.dot(Js, Js)
    if diag is not None:
        q = q + jnp.dot(s * diag, s)
    return 0.5 * q + jnp.dot(s, g)


def build_quadratic_1d(Jmv, g, s, diag=None, s0=None):
    """The coefficients `a, b, c` of `t -> a t^2 + b t + c`, the quadratic model along
    `s0 + t s`."""
    v = Jmv(s)
    a = jnp.dot(v, v)
    if diag is not None:
        a = a + jnp.dot(s * diag, s)
    a = 0.5 * a
    b = jnp.dot(g, s)
    c = jnp.zeros_like(a)
    if s0 is not None:
        u = Jmv(s0)
        b = b + jnp.dot(u, v)
        c = 0.5 * jnp.dot(u, u) + jnp.dot(g, s0)
        if diag is not None:
            b = b + jnp.dot(s0 * diag, s)
            c = c + 0.5 * jnp.dot(s0 * diag, s0)
    return a, b, c


def minimize_quadratic_1d(a, b, lb, ub, c: Any = 0.0):
    """The minimum of `a t^2 + b t + c` over `[lb, ub]`: `(t, value)`."""
    safe_a = jnp.where(a != 0, a, 1)
    extremum = -0.5 * b / safe_a
    inside = (a != 0) & (lb < extremum) & (extremum < ub)
    t = jnp.stack([lb, ub, jnp.where(inside, extremum, lb)])
    y = t * (a * t + b) + c
    i = jnp.argmin(y)
    return t[i], y[i]


def step_size_to_bound(x, s, lower, upper):
    """The largest `t` with `x + t s` in the box, and which bounds it hits (`+-1` in
    the direction of `s`, 0 elsewhere)."""
    # The bound in the direction of `s` (as SciPy's `max((lb - x) / s, (ub - x) / s)`
    # with lb <= ub), with no infinite bound in the arithmetic (its derivative would
    # poison the reverse pass).
    bound = jnp.where(s > 0, upper, lower)
    finite = (s != 0) & jnp.isfinite(bound)
    safe = jnp.where(finite, s, 1)
    steps = jnp.where(finite, (jnp.where(finite, bound, 0) - x) / safe, jnp.inf)
    t = jnp.min(steps)
    return t, jnp.where(steps == t, jnp.sign(s), 0)


def intersect_trust_region(x, s, Delta):
    """The two `t` with `|x + t s| = Delta` (x inside the sphere), `(t1, t2)` with
    `t1 <= t2`."""
    a = jnp.dot(s, s)
    a = jnp.where(a == 0, 1, a)
    b = jnp.dot(x, s)
    c = jnp.minimum(jnp.dot(x, x) - Delta**2, 0)
    d = safe_sqrt(b * b - a * c)
    q = -(b + jnp.where(b >= 0, d, -d))
    q = jnp.where(q == 0, -jnp.finfo(x.dtype).tiny, q)
    t1, t2 = q / a, c / q
    return jnp.minimum(t1, t2), jnp.maximum(t1, t2)


def in_bounds(x, lower, upper):
    return jnp.all((x >= lower) & (x <= upper))


def make_strictly_feasible(x, lower, upper, rstep=0.0):
    """`x` moved just inside the box where it is on or beyond a bound (the next
    float inwards, with `rstep=0`; else `rstep` relative to the bound)."""
    active = find_active_constraints(x, lower, upper, rstep)
    if rstep == 0:
        lo_new = jnp.nextafter(lower, upper)
        up_new = jnp.nextafter(upper, lower)
    else:
        lo_new = lower + rstep * jnp.maximum(1, jnp.abs(lower))
        up_new = upper - rstep * jnp.maximum(1, jnp.abs(upper))
    x = jnp.where(active == -1, lo_new, jnp.where(active == 1, up_new, x))
    tight = (x < lower) | (x > upper)
    return jnp.where(tight, 0.5 * (lower + upper), x)


def find_active_constraints(x, lower, upper, rtol=1e-10):
    """-1 where `x` is at its lower bound, 1 at its upper, 0 elsewhere (SciPy's)."""
    if rtol == 0:
        return jnp.where(x <= lower, -1, jnp.where(x >= upper, 1, 0))
    lower_dist, upper_dist = x - lower, upper - x
    lower_thr = rtol * jnp.maximum(1, jnp.abs(lower))
    upper_thr = rtol * jnp.maximum(1, jnp.abs(upper))
    lower_active = jnp.isfinite(lower) & (
        lower_dist <= jnp.minimum(upper_dist, lower_thr)
    )
    upper_active = jnp.isfinite(upper) & (
        upper_dist <= jnp.minimum(lower_dist, upper_thr)
    )
    return jnp.where(upper_active, 1, jnp.where(lower_active, -1, 0))


def select_step(x, Jmv, diag_h, g_h, p, p_h, d, Delta, lower, upper, theta):
    """The reflective step of the bounded method: the trust-region step if it stays
    in the box, else the best of the step cut back at the first bound, its
    reflection there, and the scaled steepest-descent step, all held strictly
    inside by `theta` (SciPy's `select_step`). Returns `(step, step_h,
    predicted_reduction)`."""
    inside = in_bounds(x + p, lower, upper)
    value_p_full = evaluate_quadratic(Jmv, g_h, p_h, diag_h)

    p_stride, hits = step_size_to_bound(x, p, lower, upper)
    r_h = jnp.where(hits != 0, -p_h, p_h)
    r = d * r_h
    p_c = p * p_stride
    p_hc = p_h * p_stride
    x_on_bound = x + p_c
    _, to_tr = intersect_trust_region(p_hc, r_h, Delta)
    to_bound, _ = step_size_to_bound(x_on_bound, r, lower, upper)
    r_stride = jnp.minimum(to_bound, to_tr)
    positive = r_stride > 0
    safe_stride = jnp.where(positive, r_stride, 1)
    r_lo = jnp.where(positive, (1 - theta) * p_stride / safe_stride, 0)
    r_up = jnp.where(
        positive, jnp.where(r_stride == to_bound, theta * to_bound, to_tr), -1
    )
    reflect = r_lo <= r_up
    a, b, c = build_quadratic_1d(Jmv, g_h, r_h, diag=diag_h, s0=p_hc)
    t, r_value = minimize_quadratic_1d(a, b, r_lo, jnp.where(reflect, r_up, r_lo), c)
    r_h = r_h * t + p_hc
    r = r_h * d
    r_value = jnp.where(reflect, r_value, jnp.inf)

    p_c = p_c * theta
    p_hc = p_hc * theta
    p_value = evaluate_quadratic(Jmv, g_h, p_hc, diag_h)
    ag_h = -g_h
    ag = d * ag_h
    g_norm = norm(ag_h)
    to_tr = Delta / jnp.where(g_norm > 0, g_norm, 1)
    to_bound, _ = step_size_to_bound(x, ag, lower, upper)
    ag_stride = jnp.where(to_bound < to_tr, theta * to_bound, to_tr)
    a, b, _ = build_quadratic_1d(Jmv, g_h, ag_h, diag=diag_h)
    t, ag_value = minimize_quadratic_1d(a, b, jnp.zeros_like(ag_stride), ag_stride)
    ag_h = ag_h * t
    ag = ag * t

    pick_p = (p_value < r_value) & (p_value < ag_value)
    pick_r = ~pick_p & (r_value < p_value) & (r_value < ag_value)

    def choose(full, cut, refl, grad):
        out = jnp.where(pick_p, cut, jnp.where(pick_r, refl, grad))
        return jnp.where(inside, full, out)

    step = choose(p, p_c, r, ag)
    step_h = choose(p_h, p_hc, r_h, ag_h)
    value = choose(value_p_full, p_value, r_value, ag_value)
    return step, step_h, -value


def solve_trust_region_2d(B, g, Delta):
    """`min 0.5 p^T B p + g^T p` subject to `|p| <= Delta`, for a 2 x 2 symmetric
    `B`: the Newton step if `B` is positive definite and the step fits, else the
    boundary solution `-(B + mu I)^{-1} g` with `mu` found by bisection."""
    lam, Q = jnp.linalg.eigh(B)
    gq = Q.T @ g
    lam_safe = jnp.where(lam > 0, lam, 1)
    p_newton = -Q @ (gq / lam_safe)
    newton = (lam[0] > 0) & (norm(p_newton) <= Delta)
    mu_lo = jnp.maximum(0, -lam[0])
    mu_hi = mu_lo + safe_div(norm(g), Delta) + jnp.abs(lam[1]) + jnp.finfo(g.dtype).tiny

    def size(mu):
        return norm(gq / jnp.maximum(lam + mu, jnp.finfo(g.dtype).tiny)) - Delta

    def body(_, c):
        lo, hi = c
        mid = 0.5 * (lo + hi)
        big = size(mid) > 0
        return jnp.where(big, mid, lo), jnp.where(big, hi, mid)

    lo, hi = lax.fori_loop(0, 100, body, (mu_lo, mu_hi))
    mu = hi
    p = -Q @ (gq / jnp.maximum(lam + mu, jnp.finfo(g.dtype).tiny))
    return jnp.where(newton, p_newton, p)


def _subspace_solver(problem, x, d, g_h, diag_h, f):
    import lineax as lx

    _, jvp = problem.linearize(x)
    _, vjp, _ = jax.vjp(problem.fn, x, has_aux=True)
    Jmv = lambda s: jvp(d * s)
    Jtv = lambda u: d * vjp(u)[0]
    n = x.size
    diag = jnp.zeros_like(x) if diag_h is None else diag_h

    def make(Delta):
        a, b, _ = build_quadratic_1d(Jmv, g_h, -g_h, diag=diag)
        g_norm = norm(g_h)
        to_tr = Delta / jnp.where(g_norm > 0, g_norm, 1)
        _, value = minimize_quadratic_1d(a, b, jnp.zeros_like(to_tr), to_tr)
        reg = safe_div(-value, Delta**2)
        op = lx.FunctionLinearOperator(
            lambda v: Jtv(Jmv(v)) + (diag + reg) * v,
            jax.ShapeDtypeStruct((n,), x.dtype),
            lx.positive_semidefinite_tag,
        )
        sol = lx.linear_solve(
            op,
            -g_h,
            lx.CG(rtol=1e-8, atol=1e-12, max_steps=max(10, 2 * n)),
            throw=False,
        )
        gn = jnp.where(jnp.all(jnp.isfinite(sol.value)), sol.value, 0)
        # An orthonormal basis of span(g_h, gn) (Gram-Schmidt; the second vector is
        # dropped when it is dependent on the first).
        e1 = g_h / jnp.where(g_norm > 0, g_norm, 1)
        w = gn - jnp.dot(e1, gn) * e1
        w_norm = norm(w)
        keep = w_norm > 1e-12 * jnp.maximum(norm(gn), 1e-300)
        e2 = jnp.where(keep, w / jnp.where(keep, w_norm, 1), 0)
        S = jnp.stack([e1, e2], axis=1)
        JS = jnp.stack([Jmv(e1), Jmv(e2)], axis=1)
        B = JS.T @ JS + (S.T * diag) @ S
        B = B + jnp.where(keep, 0, 1) * jnp.diag(jnp.array([0.0, 1.0], x.dtype))
        return S, B, S.T @ g_h

    return make
