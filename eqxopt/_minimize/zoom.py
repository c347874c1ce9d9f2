"""The zoom line search: strong Wolfe conditions, Nocedal & Wright Alg. 3.5 and 3.6."""

import equinox as eqx
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Inexact, Int32, PyTree

from .._checks import check_hyperparams
from .._custom_types import Params, ScalarLike
from .._misc import (
    scalar,
    typechecked,
)
from .linesearch import (
    AbstractLineSearch,
    AbstractLineSearchState,
    cast,
    cast_like,
    evaluate,
    init_state,
    LineSearchResult,
    scalar_dtype,
    select,
    slope,
    tree_select,
)
from .loop import while_loop


@typechecked
class ZoomState(AbstractLineSearchState):
    """State of [`eqxopt.Zoom`][].

    - `step_size`: the last accepted step size (the initial guess of the next search
        with `initial_step="keep"`).
    - `value`, `grad`: the loss and its gradient at the point the last update moved to
        (`inf` and zeros before the first search).
    - `num_evals`: value-and-gradient evaluations made by the last search.
    - `failed`: whether the last search failed (it then returned a zero step).
    - `result`: how it ended, an [`eqxopt.LineSearchResult`][].

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt


        def loss(p):
            return jnp.sum((p - 1.0) ** 2)


        search, y = eqxopt.Zoom(), jnp.zeros(3)
        value, grad = jax.value_and_grad(loss)(y)
        _, state = search.update(-grad, search.init(y), y, value=value, value_fn=loss)
        assert state.result == eqxopt.LineSearchResult.successful
        state.step_size, state.value, state.num_evals  # the accepted step, f there
        ```
    """

    step_size: Float[Array, ""]
    value: Float[Array, ""]
    grad: PyTree[Inexact[Array, "..."]]
    num_evals: Int32[Array, ""]
    failed: Bool[Array, ""]
    result: LineSearchResult


def _cubicmin(a, fa, fpa, b, fb, c, fc):
    """Minimiser of the cubic through `(a, fa)` with slope `fpa`, `(b, fb)`, `(c, fc)`;
    NaN when it does not exist. (As scipy's and Optax's; NaN-safe under autodiff.)"""
    C = fpa
    db = b - a
    dc = c - a
    denom = (db * dc) ** 2 * (db - dc)
    ok = denom != 0
    denom = select(ok, denom, 1)
    x1 = fb - fa - C * db
    x2 = fc - fa - C * dc
    A = (dc**2 * x1 - db**2 * x2) / denom
    B = (-(dc**3) * x1 + db**3 * x2) / denom
    radical = B * B - 3 * A * C
    ok = ok & (radical >= 0) & (A != 0) & lax.is_finite(radical)
    root = lax.sqrt(select(ok, radical, 0))
    xmin = a + (-B + root) / (3 * select(ok, A, 1))
    return select(ok, xmin, jnp.nan)


def _hermitemin(a, fa, fpa, b, fb, fpb):
    """Minimiser of the cubic with values `fa`, `fb` and slopes `fpa`, `fpb` at `a`,
    `b` (Nocedal & Wright, eq. 3.59); NaN when it does not exist."""
    diff = a - b
    ok = diff != 0
    d1 = fpa + fpb - 3 * (fa - fb) / select(ok, diff, 1)
    radical = d1 * d1 - fpa * fpb
    ok = ok & (radical >= 0) & lax.is_finite(radical)
    d2 = lax.sign(b - a) * lax.sqrt(select(ok, radical, 0))
    denom = fpb - fpa + 2 * d2
    ok = ok & (denom != 0)
    xmin = b - (b - a) * (fpb + d2 - d1) / select(ok, denom, 1)
    return select(ok, xmin, jnp.nan)


def _quadmin(a, fa, fpa, b, fb):
    """Minimiser of the quadratic through `(a, fa)` with slope `fpa` and `(b, fb)`;
    NaN when it does not exist."""
    db = b - a
    ok = db != 0
    db = select(ok, db, 1)
    B = (fb - fa - fpa * db) / db**2
    ok = ok & (B != 0) & lax.is_finite(B)
    xmin = a - fpa / (2 * select(ok, B, 1))
    return select(ok, xmin, jnp.nan)


# The loop's scalars live in one packed vector, so that XLA computes each iteration's
# bookkeeping in one kernel (compilation time grows with the number of kernels).
_FIELDS = (
    "i t f s err lo f_lo s_lo hi f_hi s_hi ref f_ref safe_t safe_f bracketed done "
    "failed nonfinite w1 w2"
).split()
_INDEX = {name: k for k, name in enumerate(_FIELDS)}


def _field(v, name):
    # A static slice (plain `v[k]` goes through NumPy-style indexing: slower to trace).
    return lax.index_in_dim(v, _INDEX[name], keepdims=False)


def _unpack(v, names=_FIELDS):
    if names is _FIELDS:  # every field: one `split` (fewer primitives to trace)
        parts = lax.split(v, (1,) * len(_FIELDS))
        return {name: lax.squeeze(x, (0,)) for name, x in zip(_FIELDS, parts)}
    return {name: _field(v, name) for name in names}


def _pack(d, dtype):
    # A chain of elementwise selects on one vector (not `jnp.stack`, which XLA splits
    # into one kernel per element): it fuses into a single kernel.
    n = len(_FIELDS)
    out = np.zeros((n,), dtype)
    for k, name in enumerate(_FIELDS):
        out = lax.select(_MASKS[k], lax.broadcast(cast(d[name], dtype), (n,)), out)
    return out


def _clip(x, lower, upper):
    """`jnp.clip(x, lower, upper)` (its operations, in its order) without its nested
    `jit`."""
    return lax.min(upper, lax.max(lower, x))


_MASKS = np.eye(len(_FIELDS), dtype=bool)  # NumPy: constants, not kernels


def _extrapolate(c, herm):
    """The next bracketing trial beyond the last trial `t` (sufficient decrease, lower
    value, slope still negative), from it and the previous point `lo`, as MINPACK's
    dcstep (Moré & Thuente's cases 3 and 4, minimiser not bracketed): where the slope
    shrinks in magnitude, the farther of the cubic's minimiser beyond `t` and the
    zero of the secant of the slopes; else as far as allowed; within MINPACK dcsrch's
    `[t + 1.1 (t - lo), t + 4 (t - lo)]`. `herm`: the minimiser of the cubic matching
    the values and slopes at `lo` and `t` (`_hermitemin`)."""
    t, lo, s, s_lo = c["t"], c["lo"], c["s"], c["s_lo"]
    step = t - lo
    herm = select(herm > t, herm, jnp.inf)  # no minimiser beyond `t` (or NaN): far
    shrinks = lax.abs(s) < lax.abs(s_lo)
    secant = t + s * step / select(shrinks, s_lo - s, 1)
    far = select(shrinks, lax.max(herm, secant), jnp.inf)
    return _clip(far, t + 1.1 * step, t + 4 * step)


class Zoom(AbstractLineSearch[ZoomState]):
    r"""Line search for a step satisfying the strong Wolfe conditions.

    Along a descent direction $d$ from $x$, with $\phi(t) = f(x + t d)$, it finds a
    step $t$ with

    $$\phi(t) \le \phi(0) + c_1 t \phi'(0), \qquad |\phi'(t)| \le c_2 |\phi'(0)|,$$

    by Nocedal & Wright's Algorithm 3.5 (try $t_0$, then increase the step until an
    interval containing such a step is bracketed: as MINPACK's `dcsrch` in scipy's
    L-BFGS-B, to the minimiser of the cubic through the last two trials or the zero of
    the secant of their slopes, kept within $[t_k + 1.1(t_k - t_{k-1}), t_k +
    4(t_k - t_{k-1})]$; or, with `extrapolation="multiply"`, by `increase_factor` per
    trial, as Optax) and Algorithm 3.6 (zoom into the interval by safeguarded
    interpolation: the cubic matching the values and slopes at both ends of the
    interval, else the cubic through three points, else a quadratic, else bisection;
    and bisection whenever the last two trials shrank the interval by less than a
    factor 0.66, as `dcsrch`).

    It follows `optax.scale_by_zoom_linesearch`, run in a bounded, reverse-mode
    differentiable loop with a typed state, with three deliberate differences: the
    step grows as in `dcsrch` while bracketing (`extrapolation="multiply"` for
    Optax's doubling); the two-slope cubic comes first and is tried wherever it lies
    inside the interval (Optax starts with the three-point cubic and rejects
    minimisers within 20% of an end). Both save evaluations: over the 24 searches on
    Moré & Thuente's test functions in `tests/test_minimize_linesearch.py` it takes 137
    evaluations, `dcsrch` 135, and 165 with `"multiply"`; see also
    `benchmarks/minimize.py`. Third, Hager & Zhang's approximate Wolfe condition
    $\phi'(t) \le (2c_1 - 1)\phi'(0)$ with $\phi(t) \le \phi(0) + \epsilon|\phi(0)|$
    ($\epsilon$ = `approx_dec_rtol`, as Optax's default `1e-6`) replaces the first
    condition only where the decrease it asks for, $c_1 t |\phi'(0)|$, is below
    $\epsilon|\phi(0)|$, i.e. where rounding in the values would decide it (Optax
    allows it wherever $\phi(t) \le \phi(0) + \epsilon|\phi(0)|$). Near a minimum
    this keeps the search from failing on noise; `None` switches it off.

    The outcome is explicit: if no step satisfies both conditions, the best step with
    sufficient decrease is returned (`result` is `sufficient_decrease_only`); if there
    is none (not a descent direction, non-finite values, or `max_steps` evaluations
    without sufficient decrease), the step is zero, `failed` is set and `result` says
    why. It never returns a NaN step.

    ??? cite "References"

        ```bibtex
        @book{nocedal2006numerical,
            title={Numerical Optimization},
            author={Nocedal, Jorge and Wright, Stephen J.},
            publisher={Springer}, edition={2}, year={2006}}

        @article{more1994line,
            title={Line Search Algorithms with Guaranteed Sufficient Decrease},
            author={Mor{\'e}, Jorge J. and Thuente, David J.},
            journal={ACM Transactions on Mathematical Software},
            volume={20}, number={3}, pages={286--307}, year={1994}}

        @article{hager2006algorithm,
            title={Algorithm 851: {CG\_DESCENT}, a Conjugate Gradient Method with
                   Guaranteed Descent},
            author={Hager, William W. and Zhang, Hongchao},
            journal={ACM Transactions on Mathematical Software},
            volume={32}, number={1}, pages={113--137}, year={2006}}
        ```

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt


        def loss(y):
            return jnp.sum((y - 1.0) ** 2)


        # Gradient descent with a strong-Wolfe step:
        opt, y = (
            eqxopt.Chain(eqxopt.Scale(-1.0), eqxopt.Zoom(initial_step="keep")),
            jnp.zeros(3),
        )
        value, grad = jax.value_and_grad(loss)(y)
        y, state = opt.step(y, grad, opt.init(y), value=value, grad=grad, value_fn=loss)
        ```
    """

    c1: ScalarLike = 1e-4
    c2: ScalarLike = 0.9
    max_steps: int = eqx.field(default=20, static=True)
    initial_step: str = eqx.field(default="one", static=True)
    increase_factor: ScalarLike = 2.0
    max_step_size: ScalarLike | None = None
    approx_dec_rtol: ScalarLike | None = 1e-6
    interval_threshold: ScalarLike = 1e-5
    extrapolation: str = eqx.field(default="cubic", static=True)

    def __check_init__(self):
        check_hyperparams(
            self,
            positive=("c1", "c2", "increase_factor")
            + (("max_step_size",) if self.max_step_size is not None else ()),
            unit_interval=("c1", "c2"),
            nonnegative=("interval_threshold",)
            + (("approx_dec_rtol",) if self.approx_dec_rtol is not None else ()),
            positive_int=("max_steps",),
            choices={
                "initial_step": ("one", "keep"),
                "extrapolation": ("multiply", "cubic"),
            },
        )
        c1, c2 = self.c1, self.c2
        if isinstance(c1, (int, float)) and isinstance(c2, (int, float)) and c1 >= c2:
            raise ValueError(
                f"`Zoom(c1=...)` must be below `c2` (0 < c1 < c2 < 1), got c1={c1}, "
                f"c2={c2}."
            )
        f = self.increase_factor
        if isinstance(f, (int, float)) and f <= 1:
            raise ValueError(f"`Zoom(increase_factor=...)` must be > 1, got {f}.")

    def init(self, params: Params) -> ZoomState:
        return init_state(ZoomState, params)

    def search(
        self, value_and_grad_fn, params, direction, value, grad, state, max_step=None
    ):
        dtype = scalar_dtype(params)
        t_max = None
        if self.max_step_size is not None:
            t_max = scalar(self.max_step_size, dtype)
        if max_step is not None:
            bound = jnp.asarray(max_step).astype(dtype)
            t_max = bound if t_max is None else lax.min(t_max, bound)
        c1, c2 = scalar(self.c1, dtype), scalar(self.c2, dtype)
        increase = scalar(self.increase_factor, dtype)
        threshold = scalar(self.interval_threshold, dtype)
        zero, one = np.zeros((), dtype), np.ones((), dtype)
        grad = cast_like(grad, state.grad)
        f0 = jnp.real(jnp.asarray(value)).astype(dtype)
        s0 = slope(grad, direction, dtype)
        if self.initial_step == "one":
            t0 = one
        else:
            previous = state.step_size.astype(dtype)
            t0 = select(previous > 0, previous, one)
        if t_max is not None:
            t0 = lax.min(t0, t_max)

        def errors(t, f, s):
            decrease = f - f0 - c1 * t * s0
            if self.approx_dec_rtol is not None:
                # Hager & Zhang's approximate Wolfe condition, used only where the
                # decrease Armijo asks for is below `approx_dec_rtol * |f0|`, i.e.
                # where rounding in the values would decide it.
                eps = scalar(self.approx_dec_rtol, dtype)
                approx = s - (2 * c1 - 1) * s0
                near = f - f0 - eps * lax.abs(f0)
                noisy = c1 * lax.abs(t * s0) <= eps * lax.abs(f0)
                decrease = select(
                    noisy, lax.min(lax.max(approx, near), decrease), decrease
                )
            decrease = lax.max(decrease, zero)
            decrease = select(decrease != decrease, jnp.inf, decrease)
            curvature = lax.max(lax.abs(s) - c2 * lax.abs(s0), zero)
            curvature = select(curvature != curvature, jnp.inf, curvature)
            return decrease, lax.max(decrease, curvature)

        start_ok = lax.is_finite(f0) & lax.is_finite(s0) & (s0 < 0)
        init = _pack(
            dict(
                i=zero,
                t=zero,
                f=f0,
                s=s0,
                err=np.full((), np.inf, dtype),
                lo=zero,
                f_lo=f0,
                s_lo=s0,
                hi=zero,
                f_hi=f0,
                s_hi=s0,
                ref=zero,
                f_ref=f0,
                safe_t=zero,
                safe_f=f0,
                bracketed=zero,
                done=zero,
                failed=select(start_ok, zero, one),
                nonfinite=select(lax.is_finite(f0) & lax.is_finite(s0), zero, one),
                w1=np.full((), np.inf, dtype),
                w2=np.full((), np.inf, dtype),
            ),
            dtype,
        )

        def trial(c):
            """The next trial step: bracketing (Alg. 3.5) or zooming (Alg. 3.6)."""
            zooming = c["bracketed"] > 0
            lo, hi = c["lo"], c["hi"]
            # One two-slope cubic serves both phases (a smaller program): through
            # `lo` and `hi` when zooming, through `lo` and the last trial `t` (the
            # previous and last trials) when extrapolating.
            if self.extrapolation == "multiply":
                b, f_b, s_b = hi, c["f_hi"], c["s_hi"]
            else:
                b = select(zooming, hi, c["t"])
                f_b = select(zooming, c["f_hi"], c["f"])
                s_b = select(zooming, c["s_hi"], c["s"])
            herm = _hermitemin(lo, c["f_lo"], c["s_lo"], b, f_b, s_b)
            if self.extrapolation == "multiply":
                t_next = increase * c["t"]
            else:
                t_next = _extrapolate(c, herm)
            t_bracket = select(c["i"] == 0, t0, t_next)
            if t_max is not None:
                t_bracket = lax.min(t_bracket, t_max)
            delta = lax.abs(hi - lo)
            left, right = lax.min(lo, hi), lax.max(lo, hi)
            cubic = _cubicmin(
                lo, c["f_lo"], c["s_lo"], hi, c["f_hi"], c["ref"], c["f_ref"]
            )
            use_cubic = (cubic > left + 0.2 * delta) & (cubic < right - 0.2 * delta)
            quad = _quadmin(lo, c["f_lo"], c["s_lo"], hi, c["f_hi"])
            use_quad = (quad > left + 0.1 * delta) & (quad < right - 0.1 * delta)
            bisect = (lo + hi) / 2
            middle = select(use_cubic, cubic, select(use_quad, quad, bisect))
            # First choice: the cubic matching the values and slopes at both ends
            # (both are known), kept inside the interval but not away from its ends
            # (as MINPACK's dcstep): a minimiser close to an end is tried where it
            # is, which saves evaluations over Optax's choices above. Progress is
            # guaranteed as in MINPACK's dcsrch: bisection whenever the last two
            # trials shrank the interval by less than a factor 0.66.
            herm = _clip(herm, left + 1e-6 * delta, right - 1e-6 * delta)
            inside = (herm > left) & (herm < right)  # not NaN, not rounded to an end
            middle = select(inside, herm, middle)
            slow = delta >= 0.66 * c["w2"]
            middle = select(slow, bisect, middle)
            return select(zooming, middle, t_bracket)

        def cond(carry):
            v = carry[0]
            return (_field(v, "done") == 0) & (_field(v, "failed") == 0)

        def body(carry):
            v, ret_g = carry
            c = _unpack(v)
            t = trial(c)
            f, g, s = evaluate(value_and_grad_fn, params, direction, t, grad, dtype)
            decrease, err = errors(t, f, s)
            sufficient = decrease <= 0
            wolfe = err <= 0
            zooming = c["bracketed"] > 0
            # Bracketing phase: the new point becomes `hi`, or `lo` (and the previous
            # point `hi`), or the bracket is not found yet.
            high_is_new = (decrease > 0) | ((f >= c["f"]) & (c["i"] > 0))
            low_is_new = (s >= 0) & ~high_is_new
            b_bracketed = high_is_new | low_is_new | wolfe
            # Zoom phase: the new point replaces `hi` or `lo` (Alg. 3.6).
            high_is_mid = (decrease > 0) | (f >= c["f_lo"])
            high_is_low = (s * (c["hi"] - c["lo"]) >= 0) & ~high_is_mid
            high_moved = high_is_mid | high_is_low

            def pick(zoom, bracket):
                return select(zooming, zoom, bracket)

            new_lo = pick(
                select(high_is_mid, c["lo"], t), select(low_is_new, t, c["t"])
            )
            new_f_lo = pick(
                select(high_is_mid, c["f_lo"], f), select(low_is_new, f, c["f"])
            )
            new_s_lo = pick(
                select(high_is_mid, c["s_lo"], s), select(low_is_new, s, c["s"])
            )
            new_hi = pick(
                select(high_is_mid, t, select(high_is_low, c["lo"], c["hi"])),
                select(low_is_new, c["t"], t),
            )
            new_f_hi = pick(
                select(high_is_mid, f, select(high_is_low, c["f_lo"], c["f_hi"])),
                select(low_is_new, c["f"], f),
            )
            new_s_hi = pick(
                select(high_is_mid, s, select(high_is_low, c["s_lo"], c["s_hi"])),
                select(low_is_new, c["s"], s),
            )
            take_safe = pick(sufficient & (f < c["safe_f"]), sufficient)
            safe_t = select(take_safe, t, c["safe_t"])
            if t_max is None:
                done = wolfe
            else:
                max_reached = ~zooming & (t >= t_max)
                done = pick(wolfe, wolfe | (max_reached & ~b_bracketed))
            too_small = (
                zooming & (lax.abs(c["hi"] - c["lo"]) <= threshold) & (safe_t > 0)
            )
            failed = ((c["i"] + 1 >= self.max_steps) | too_small) & ~done
            nonfinite = (c["nonfinite"] > 0) | ~lax.is_finite(f) | ~lax.is_finite(s)
            new = dict(
                i=c["i"] + 1,
                t=t,
                f=f,
                s=s,
                err=err,
                lo=new_lo,
                f_lo=new_f_lo,
                s_lo=new_s_lo,
                hi=new_hi,
                f_hi=new_f_hi,
                s_hi=new_s_hi,
                ref=pick(select(high_moved, c["hi"], c["lo"]), new_lo),
                f_ref=pick(select(high_moved, c["f_hi"], c["f_lo"]), new_f_lo),
                safe_t=safe_t,
                safe_f=select(take_safe, f, c["safe_f"]),
                bracketed=zooming | b_bracketed,
                done=done,
                failed=failed,
                nonfinite=nonfinite,
                # The interval's length before this trial and the one before (+inf
                # outside the zoom phase), for the bisection safeguard.
                w1=select(zooming, lax.abs(c["hi"] - c["lo"]), jnp.inf),
                w2=select(zooming, c["w1"], jnp.inf),
            )
            # The gradient at the point that would be returned now: the last trial
            # once done, else the best point with sufficient decrease (else start).
            ret_g = tree_select(done | take_safe, g, ret_g)
            return _pack(new, dtype), ret_g

        v, ret_g = while_loop(cond, body, (init, grad), max_steps=self.max_steps)
        c = _unpack(v, ("t", "f", "err", "safe_t", "safe_f", "done", "nonfinite", "i"))
        done = c["done"] > 0
        wolfe = done & (c["err"] <= 0)
        use_safe = ~done & (c["safe_t"] > 0)
        failed = ~done & ~use_safe
        step = select(done, c["t"], select(use_safe, c["safe_t"], zero))
        new_value = select(done, c["f"], select(use_safe, c["safe_f"], f0))
        R = LineSearchResult
        result = R.where(
            wolfe,
            R.successful,
            R.where(
                ~failed,
                R.sufficient_decrease_only,
                R.where(
                    lax.is_finite(f0) & lax.is_finite(s0) & (s0 >= 0),
                    R.not_descent,
                    R.where(c["nonfinite"] > 0, R.nonfinite, R.max_steps_reached),
                ),
            ),
        )
        new_state = ZoomState(
            step_size=select(
                failed, state.step_size, step.astype(state.step_size.dtype)
            ),
            value=new_value.astype(state.value.dtype),
            grad=cast_like(ret_g, state.grad),
            num_evals=c["i"].astype(jnp.int32),
            failed=failed,
            result=result,
        )
        return step, new_state


Zoom.__init__.__doc__ = r"""**Arguments:**

- `c1`: the sufficient-decrease constant $c_1$ (Optax's `slope_rtol`), in (0, `c2`).
- `c2`: the curvature constant $c_2$ (Optax's `curv_rtol`), in (`c1`, 1); 0.9 suits
    quasi-Newton directions, 0.1 nonlinear conjugate gradients.
- `max_steps`: the maximum number of function-and-gradient evaluations per search
    (Optax's `max_linesearch_steps`; Optax's L-BFGS uses 20). (Static.)
- `initial_step`: the first trial step: `"one"` (a unit step, right for Newton and
    quasi-Newton directions) or `"keep"` (the last accepted step, for gradient
    descent). (Static.)
- `increase_factor`: the factor by which the step grows while bracketing (> 1),
    with `extrapolation="multiply"`.
- `max_step_size`: an upper bound on the step, or `None`.
- `approx_dec_rtol`: $\epsilon$ of Hager & Zhang's approximate Wolfe condition
    (default `1e-6`), or `None` for the strong Wolfe conditions only.
- `interval_threshold`: once the bracket is shorter than this and a step with
    sufficient decrease is known, that step is returned (Optax's
    `stepsize_precision`).
- `extrapolation`: how the step grows while bracketing: `"cubic"` (default, as
    MINPACK's `dcsrch`, see above; fewer evaluations where the first trial is far too
    short) or `"multiply"` (by `increase_factor`, as Optax). (Static.)
"""
