"""Newton-CG: a trust-region Newton method whose steps come from a truncated
conjugate-gradient solve on Hessian-vector products (Steihaug 1983, Toint 1981), as
SciPy's `minimize(method="trust-ncg")`."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Bool, Float, Inexact, Int32, PyTree

from .._checks import concrete_scalar, need_extra, need_params
from .._core.base import scalar_hyperparams
from .._custom_types import Params, Updates
from .._misc import increment, is_param, tree_map, typechecked, zero_count
from .linesearch import (
    AbstractLineSearchOptimizer,
    below_resolution,
    cast_like,
    conj,
    Evaluation,
    scalar_dtype,
    select,
    store_dtype,
)
from .loop import while_loop


@typechecked
class NewtonCGState(eqx.Module):
    """State of [`eqxopt.NewtonCG`][].

    - `count`: the number of updates (accepted or rejected trial steps).
    - `radius`: the trust radius for the next update.
    - `value`, `grad`: the loss and its gradient at the params after the last update
        (the trial point if it was accepted, else the params it started from).
    - `num_evals`: the evaluations of the loss (with its gradient) in the last update.
    - `num_hvps`: the Hessian-vector products since `init`.
    - `accepted`: whether the last trial step was accepted.
    - `stalled`: whether the last update could not move the params beyond rounding
        (the model predicts no decrease, or the trust region has shrunk below the
        resolution of the params).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        state = eqxopt.NewtonCG().init(jnp.zeros(3))
        assert float(state.radius) == 1.0  # SciPy's initial trust radius
        ```
    """

    count: Int32[Array, ""]
    radius: Float[Array, ""]
    value: Float[Array, ""]
    grad: PyTree[Inexact[Array, "..."]]
    num_evals: Int32[Array, ""]
    num_hvps: Int32[Array, ""]
    accepted: Bool[Array, ""]
    stalled: Bool[Array, ""]


def _flat(tree, dtype) -> Array:
    leaves = [x for x in jtu.tree_leaves(tree) if is_param(x)]
    return jnp.concatenate([jnp.ravel(x).astype(dtype) for x in leaves])


def _unflat(vector, like):
    """`vector` split into the leaves of `like`, each in that leaf's dtype."""
    leaves, treedef = jtu.tree_flatten(like, is_leaf=lambda x: x is None)
    out, start = [], 0
    for x in leaves:
        if is_param(x):
            out.append(vector[start : start + x.size].reshape(x.shape).astype(x.dtype))
            start += x.size
        else:
            out.append(None)
    return jtu.tree_unflatten(treedef, out)


def _boundary(z, d, radius):
    """The two roots `ta <= tb` of `|z + t d| = radius` (SciPy's stable formula)."""
    a = jnp.dot(d, d)
    b = 2 * jnp.dot(z, d)
    c = jnp.dot(z, z) - radius**2
    disc = jnp.maximum(b * b - 4 * a * c, 0)
    aux = b + jnp.where(b >= 0, 1, -1) * jnp.sqrt(disc)
    safe_aux = jnp.where(aux == 0, 1, aux)
    safe_a = jnp.where(a == 0, 1, a)
    ta = -aux / (2 * safe_a)
    tb = -2 * c / safe_aux
    return jnp.minimum(ta, tb), jnp.maximum(ta, tb)


class _CG(eqx.Module):
    k: Int32[Array, ""]
    z: Array
    r: Array
    d: Array
    done: Bool[Array, ""]
    hits: Bool[Array, ""]
    model: Array  # g.z + z.Bz / 2 at the returned step


def _steihaug(g, hvp, radius, max_steps):
    """Nocedal & Wright's algorithm 7.2 as SciPy's `CGSteihaugSubproblem.solve`:
    `(p, hits_boundary, model(p) - f, number of Hessian-vector products)`. The model
    value comes from the CG residual (`m(z) - f = z.(g + r) / 2`, `r = g + B z`), not
    from another Hessian-vector product as SciPy's."""
    dtype = g.dtype
    gg = jnp.dot(g, g)
    g_mag = jnp.sqrt(gg)
    tolerance = jnp.minimum(0.5, jnp.sqrt(g_mag)) * g_mag
    zero = jnp.zeros((), dtype)
    init = _CG(
        zero_count(), jnp.zeros_like(g), g, -g, gg == 0, jnp.zeros((), bool), zero
    )

    def model(z, r):
        return 0.5 * jnp.dot(z, g + r)

    def body(c: _CG) -> _CG:
        bd = hvp(c.d)
        dbd = jnp.dot(c.d, bd)
        rr = jnp.dot(c.r, c.r)
        ta, tb = _boundary(c.z, c.d, radius)
        # Negative curvature: the better of the two boundary points (by the model).
        pa, pb = c.z + ta * c.d, c.z + tb * c.d
        qa, qb = model(pa, c.r + ta * bd), model(pb, c.r + tb * bd)
        negative = dbd <= 0
        alpha = rr / jnp.where(negative, 1, dbd)
        z_next = c.z + alpha * c.d
        outside = ~negative & (jnp.sqrt(jnp.dot(z_next, z_next)) >= radius)
        r_next = c.r + alpha * bd
        rr_next = jnp.dot(r_next, r_next)
        small = jnp.sqrt(rr_next) < tolerance
        k = c.k + 1
        done = negative | outside | small | (k >= max_steps)
        p = jnp.where(negative, jnp.where(qa < qb, pa, pb), z_next)
        p = jnp.where(outside, pb, p)
        q = jnp.where(
            negative,
            jnp.minimum(qa, qb),
            jnp.where(outside, qb, model(z_next, r_next)),
        )
        beta = rr_next / jnp.where(rr == 0, 1, rr)
        d_next = -r_next + beta * c.d
        return _CG(
            k,
            p,
            jnp.where(done, c.r, r_next),
            jnp.where(done, c.d, d_next),
            done,
            negative | outside,
            q,
        )

    out = while_loop(lambda c: ~c.done, body, init, max_steps=max_steps)
    return out.z, out.hits, out.model, out.k


class NewtonCG(AbstractLineSearchOptimizer[NewtonCGState]):
    r"""Newton-CG: a trust-region Newton method with Steihaug-Toint truncated
    conjugate gradients, as SciPy's `minimize(method="trust-ncg")`.

    Each update approximately minimises the quadratic model
    $m(p) = f + g^\top p + \tfrac12 p^\top \nabla^2 f\, p$ over $\|p\|_2 \le \Delta$
    by conjugate gradients on Hessian-vector products
    $\nabla^2 f\, v = \partial_\epsilon \nabla f(y + \epsilon v)$ (forward-over-reverse
    differentiation: the Hessian is never formed). CG stops at the trust-region
    boundary, along a direction of negative curvature (at the better of its two
    boundary points) or when the residual is below
    $\min(0.5, \sqrt{\|g\|})\,\|g\|$. The trial point $y + p$ is accepted when
    $\rho = (f(y) - f(y + p)) / (m(0) - m(p)) > \eta$; the radius shrinks by 4 when
    $\rho < 1/4$ and doubles (up to `max_radius`) when $\rho > 3/4$ and $p$ is on the
    boundary. These are SciPy's rules; a non-finite trial loss counts as
    $\rho = -\infty$ (SciPy would neither accept nor shrink).

    Every update evaluates the loss and its gradient once, at the trial point;
    [`eqxopt.minimize`][] counts the Hessian-vector products in
    `stats["num_hvps"]`, and a rejected trial step as a step. Without bounds only:
    `minimize(..., bounds=...)` raises a `ValueError` (use [`eqxopt.LBFGSB`][]).
    `update(grads, state, params, *, value, value_fn)` needs the loss `value` at
    `params` and `value_fn: params -> loss` (twice differentiable); `minimize`
    passes them. Real params only.

    ??? cite "References"

        ```bibtex
        @article{steihaug1983conjugate,
            title={The Conjugate Gradient Method and Trust Regions in Large Scale
                   Optimization},
            author={Steihaug, Trond},
            journal={SIAM Journal on Numerical Analysis},
            volume={20}, number={3}, pages={626--637}, year={1983}}

        @book{nocedal2006numerical,
            title={Numerical Optimization}, author={Nocedal, Jorge and Wright,
            Stephen J.}, edition={2}, publisher={Springer}, year={2006}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        def rosenbrock(y, args):
            return jnp.sum(100 * (y[1:] - y[:-1] ** 2) ** 2 + (1 - y[:-1]) ** 2)


        sol = eqxopt.minimize(rosenbrock, eqxopt.NewtonCG(), jnp.zeros(10))
        assert jnp.allclose(sol.value, 1.0, atol=1e-4)
        sol.stats["num_hvps"]  # Hessian-vector products used
        ```
    """

    initial_radius: float = 1.0
    max_radius: float = 1000.0
    eta: float = 0.15
    max_cg_steps: int | None = eqx.field(default=None, static=True)

    real_only = "its trust region is a real Euclidean ball"
    refuses_bounds = (
        "its trust region is a ball around the point, not a box; use "
        "`eqxopt.LBFGSB()` for box constraints"
    )
    rejects_steps = True
    state_stats = ("num_hvps",)

    def __check_init__(self):
        eta = concrete_scalar(self, "eta", self.eta)
        if eta is not None and not 0 <= eta < 0.25:
            raise ValueError(f"`NewtonCG(eta=...)` must be in [0, 0.25), got {eta}.")
        top = concrete_scalar(self, "max_radius", self.max_radius)
        if top is not None and not top > 0:
            raise ValueError(
                f"`NewtonCG(max_radius=...)` must be > 0, got {self.max_radius}."
            )
        r0 = concrete_scalar(self, "initial_radius", self.initial_radius)
        if r0 is not None and not (r0 > 0 and (top is None or r0 < top)):
            raise ValueError(
                "`NewtonCG(initial_radius=...)` must be > 0 and < `max_radius`, got "
                f"{self.initial_radius}."
            )
        steps = self.max_cg_steps
        if steps is not None and (
            isinstance(steps, bool) or not isinstance(steps, int) or steps < 1
        ):
            raise ValueError(
                f"`NewtonCG(max_cg_steps=...)` must be None or an int >= 1, got "
                f"{steps!r}."
            )

    def init(self, params: Params) -> NewtonCGState:
        dtype = store_dtype(params)
        return NewtonCGState(
            count=zero_count(),
            radius=jnp.asarray(self.initial_radius, dtype),
            value=jnp.zeros((), dtype),
            grad=tree_map(jnp.zeros_like, params),
            num_evals=zero_count(),
            num_hvps=zero_count(),
            accepted=jnp.zeros((), bool),
            stalled=jnp.zeros((), bool),
        )

    def update(
        self,
        grads: Updates,
        state: NewtonCGState,
        params: Params | None = None,
        **extra,
    ) -> tuple[Updates, NewtonCGState]:
        need_params(self, params)
        value, value_fn = need_extra(self, extra, "value", "value_fn")
        dtype = scalar_dtype(params)
        x = _flat(params, dtype)
        g = _flat(grads, dtype)
        n = x.shape[0]
        f = jnp.asarray(value).astype(dtype)
        radius = state.radius.astype(dtype)

        def grad_flat(v):
            return _flat(conj(jax.grad(value_fn)(_unflat(v, params))), dtype)

        def hvp(v):
            return jax.jvp(grad_flat, (x,), (v,))[1]

        max_steps = n if self.max_cg_steps is None else self.max_cg_steps
        p, hits, model, num_hvps = _steihaug(g, hvp, radius, max_steps)
        step = _unflat(p, params)
        trial = eqx.apply_updates(params, step)
        f_new, g_new = eqx.filter_value_and_grad(value_fn)(trial)
        f_new = jnp.asarray(f_new).astype(dtype)
        g_new = cast_like(conj(g_new), grads)
        predicted = -model
        actual = f - f_new
        bad_model = ~(predicted > 0)
        safe = jnp.where(bad_model, 1, predicted)
        rho = jnp.where(jnp.isfinite(f_new), actual / safe, -jnp.inf)
        eta = jnp.asarray(self.eta, dtype)
        top = jnp.asarray(self.max_radius, dtype)
        new_radius = jnp.where(
            rho < 0.25,
            0.25 * radius,
            jnp.where((rho > 0.75) & hits, jnp.minimum(2 * radius, top), radius),
        )
        accepted = ~bad_model & (rho > eta)
        # SciPy stops when the model predicts no decrease; a step that cannot move the
        # params beyond rounding stops too (the trust region has shrunk below them).
        stalled = bad_model | (~accepted & below_resolution(step, params))
        new_radius = jnp.where(bad_model, radius, new_radius)
        updates = tree_map(
            lambda s: jnp.where(accepted, s, jnp.zeros_like(s)),
            step,
            names=("step",),
        )
        out_value = select(accepted, f_new, f)
        out_grad = tree_map(
            lambda new, old: jnp.where(accepted, new, old),
            g_new,
            grads,
            names=("new", "old"),
        )
        sdtype = state.radius.dtype
        new_state = NewtonCGState(
            count=increment(state.count),
            radius=new_radius.astype(sdtype),
            value=out_value.astype(sdtype),
            grad=cast_like(out_grad, state.grad),
            num_evals=jnp.ones((), jnp.int32),
            num_hvps=state.num_hvps + num_hvps.astype(jnp.int32),
            accepted=accepted,
            stalled=stalled,
        )
        return updates, new_state

    def hyperparams(self, state: NewtonCGState) -> dict[str, Any]:
        return scalar_hyperparams(self, state.count)

    def last_evaluation(self, state: NewtonCGState) -> Evaluation:
        """The loss and gradient at the params after the last update."""
        return Evaluation(
            state.value,
            state.grad,
            jnp.zeros((), bool),
            state.num_evals,
            state.stalled,
        )


NewtonCG.__init__.__doc__ = r"""**Arguments:**

- `initial_radius`: the first trust radius (SciPy's 1.0); in `(0, max_radius)`.
- `max_radius`: the largest trust radius (SciPy's 1000.0).
- `eta`: the acceptance threshold on $\rho$ (SciPy's 0.15), in `[0, 0.25)`.
- `max_cg_steps`: the most CG iterations (Hessian-vector products) per update;
    `None` (default) for the number of variables, where CG terminates in exact
    arithmetic. (Static.)
"""
