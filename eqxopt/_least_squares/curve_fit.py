"""`curve_fit`: SciPy's `curve_fit` on `eqxopt.least_squares`."""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import jax.scipy.linalg as jsl
import jax.tree_util as jtu
from jaxtyping import Array, PyTree

from .base import AbstractLeastSquaresSolver
from .least_squares import least_squares


def _residuals(p, args):
    f, xdata, ydata, sigma = args
    r = jnp.ravel(jnp.asarray(f(xdata, p)) - ydata)
    if sigma is None:
        return r
    if sigma.ndim <= 1:
        return r / jnp.ravel(sigma)
    L = jnp.linalg.cholesky(sigma)
    return jsl.solve_triangular(L, r, lower=True)


class _Model:
    """`f` as a hashable, comparable part of the compilation key."""

    def __init__(self, f):
        self.f = f

    def __call__(self, xdata, p):
        return self.f(xdata, p)

    def __hash__(self):
        return hash(self.f)

    def __eq__(self, other):
        return isinstance(other, _Model) and other.f == self.f


def curve_fit(
    f: Callable[[Any, PyTree], Any],
    xdata: Any,
    ydata: Any,
    p0: PyTree,
    *,
    sigma: Any = None,
    absolute_sigma: bool = False,
    bounds: tuple[Any, Any] | None = None,
    solver: AbstractLeastSquaresSolver | None = None,
    **least_squares_options: Any,
) -> tuple[PyTree, Array]:
    r"""Fit `f(xdata, params)` to `ydata` by least squares: SciPy's `curve_fit`, on
    [`eqxopt.least_squares`][], under `jit` and `vmap` (many fits at once).

    Minimizes $\sum_i ((f(x, p)_i - y_i) / \sigma_i)^2$ (with a 2-D `sigma`, the
    covariance of `ydata`: $r^T \Sigma^{-1} r$, through its Cholesky factor, as
    SciPy). One difference from SciPy: `f` takes the params as one PyTree of `p0`'s
    structure (`f(xdata, params)`), not as `*params`.

    The covariance of the estimate is SciPy's: `pcov = (J^T J)^+` at the optimum
    (through an SVD, singular values below `eps * max(J.shape) * s[0]` dropped),
    multiplied by the reduced chi-square `sum(r**2) / (len(ydata) - len(p))` unless
    `absolute_sigma` (then `sigma` are absolute errors). Where the Jacobian is
    rank-deficient (or `len(ydata) <= len(p)` without `absolute_sigma`) every entry
    of `pcov` is `inf`, as SciPy's `lm`. `pcov` is over `ravel_pytree(p0)`'s order;
    `sqrt(diag(pcov))` are the standard errors.

    **Arguments:**

    - `f`: the model, `f(xdata, params) -> predictions` (an array of `ydata`'s
        size).
    - `xdata`: the independent variable(s): any PyTree, passed to `f` unchanged.
    - `ydata`: the data, an array.
    - `p0`: the initial params, any PyTree (keyword-less: required, unlike SciPy's
        default of ones, since its structure defines the params).
    - `sigma`: `None`, the standard deviations of `ydata` (scalar or 1-D, weights
        `1/sigma`), or its 2-D covariance matrix.
    - `absolute_sigma`: whether `sigma` is absolute (`pcov` unscaled).
    - `bounds`: `(lower, upper)` prefixes of `p0`, as in
        [`eqxopt.least_squares`][].
    - `solver`: `None` (`eqxopt.TrustRegionReflective()`) or a solver of
        [`eqxopt.least_squares`][]. Its `jac` must not be `"matrix-free"`
        (`pcov` needs the Jacobian).
    - `**least_squares_options`: passed to [`eqxopt.least_squares`][] (`ftol`,
        `xtol`, `gtol`, `max_steps`, `throw`, `adjoint`, ...).

    **Returns:**

    `(popt, pcov)`: the fitted params (a PyTree of `p0`'s structure) and their
    covariance (an `(n, n)` array).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        def model(t, p):
            return p["a"] * jnp.exp(-p["k"] * t)


        t = jnp.linspace(0.0, 4.0, 50)
        y = model(t, {"a": 2.0, "k": 0.7}) + 0.01 * jnp.sin(40 * t)
        popt, pcov = eqxopt.curve_fit(model, t, y, {"a": 1.0, "k": 1.0})
        errors = jnp.sqrt(jnp.diag(pcov))  # standard errors of (a, k)
        ```
    """
    if getattr(solver, "jac", None) == "matrix-free":
        raise ValueError(
            "eqxopt.curve_fit: `solver=...(jac='matrix-free')` gives no Jacobian, "
            "which `pcov` needs; use `jac='auto'`."
        )
    if "has_aux" in least_squares_options:
        raise ValueError("eqxopt.curve_fit: `has_aux` is not an option of curve_fit.")
    # Python numbers in `p0` are params too (SciPy's p0 is a list of floats).
    p0 = jtu.tree_map(
        lambda v: jnp.asarray(v, float) if isinstance(v, (int, float)) else v, p0
    )
    ydata = jnp.asarray(ydata)
    if not jnp.issubdtype(ydata.dtype, jnp.floating):
        ydata = ydata.astype(float)
    sig = None if sigma is None else jnp.asarray(sigma, ydata.dtype)
    if sig is not None and sig.ndim == 2 and sig.shape != (ydata.size, ydata.size):
        raise ValueError(
            f"eqxopt.curve_fit: a 2-D `sigma` must be ({ydata.size}, {ydata.size}) "
            f"(the covariance of `ydata`), got {sig.shape}."
        )
    if sig is not None and sig.ndim > 2:
        raise ValueError("eqxopt.curve_fit: `sigma` must be a scalar, 1-D or 2-D.")
    sol = least_squares(
        _residuals,
        solver,
        p0,
        (_Model(f), xdata, ydata, sig),
        bounds=bounds,
        **least_squares_options,
    )
    J = sol.jac
    assert J is not None
    ysize, n = J.shape
    _, s, Vt = jnp.linalg.svd(J, full_matrices=False)
    threshold = jnp.finfo(J.dtype).eps * max(J.shape) * s[0]
    keep = s > threshold
    inv_s2 = jnp.where(keep, 1 / jnp.where(keep, s, 1) ** 2, 0)
    pcov = (Vt.T * inv_s2) @ Vt
    singular = ~jnp.all(keep) if ysize >= n else jnp.ones((), bool)
    if not absolute_sigma:
        if ysize > n:
            pcov = pcov * (2 * sol.loss / (ysize - n))
        else:
            singular = jnp.ones((), bool)
    pcov = jnp.where(singular | jnp.any(jnp.isnan(pcov)), jnp.inf, pcov)
    return sol.value, pcov
