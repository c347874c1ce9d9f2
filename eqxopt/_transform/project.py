"""Box constraints: broadcasting `(lower, upper)` bounds over params, the projection
onto the box, and the `ProjectBox` transform."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer
from jaxtyping import Array, PyTree

from .._base import AbstractOptimizer, EmptyState
from .._custom_types import Params, Updates
from .._misc import is_param, out_dtype, real_dtype, tree_map


def _full(bound, leaf, fill) -> Array:
    """`bound` (None, a scalar or an array broadcastable to `leaf`) as an array of
    `leaf`'s shape and real dtype; `None` means `fill` (+-inf)."""
    dtype = real_dtype(leaf.dtype)
    if bound is None:
        return jnp.full(leaf.shape, fill, dtype)
    return jnp.broadcast_to(jnp.asarray(bound).astype(dtype), leaf.shape)


def _view(bound, leaf, fill) -> np.ndarray | None:
    """`bound` broadcast to `leaf`'s shape as a NumPy view (no copy, no JAX
    operation); None for an open side or a traced bound, whose values are unknown."""
    if bound is None or isinstance(bound, Tracer):
        return None
    return np.broadcast_to(np.asarray(bound), leaf.shape)


def _per_param(bounds, params, what: str, leaf_fn) -> list:
    """For each side of `bounds`, `leaf_fn(bound, leaf, fill)` at every param leaf,
    with the bound of the subtree the leaf sits in."""
    if not (isinstance(bounds, (tuple, list)) and len(bounds) == 2):
        raise ValueError(f"`{what}` must be a pair `(lower, upper)`, got {bounds!r}.")
    out = []
    for side, bound, fill in (
        ("lower", bounds[0], -jnp.inf),
        ("upper", bounds[1], jnp.inf),
    ):

        def per_subtree(b, sub, fill=fill):
            return tree_map(lambda p: leaf_fn(b, p, fill), sub)

        try:
            full = jtu.tree_map(per_subtree, bound, params, is_leaf=lambda x: x is None)
        except ValueError as e:
            raise ValueError(
                f"`{what}`: `{side}` must be a PyTree prefix of the params (`y0`): a "
                "scalar, an array, None, or a tree whose structure matches the "
                f"params' top levels. ({e})"
            ) from None
        out.append(full)
    return out


def check_bound_values(bounds: tuple[Any, Any], *, what: str) -> None:
    """The checks that need no params: every leaf of each side is real (a complex or
    non-numeric bound raises) and, where concrete, not NaN (NaN compares false with
    everything, so it would leave its side open). Each error names the side and the
    leaf's path in it."""
    for side, bound in zip(("lower", "upper"), bounds):
        for path, b in jtu.tree_flatten_with_path(bound)[0]:
            at = jtu.keystr(path) or "the params"
            dtype = b.dtype if hasattr(b, "dtype") else np.asarray(b).dtype
            if jnp.issubdtype(dtype, jnp.complexfloating):
                kind = "complex"
            elif not (jnp.issubdtype(dtype, jnp.number) or dtype == bool):
                kind = str(dtype)
            else:
                kind = None
            if kind is not None:
                raise ValueError(
                    f"`{what}`: box bounds must be real, got a {kind} `{side}` bound "
                    f"at {at}."
                )
            if not isinstance(b, Tracer) and np.any(np.isnan(np.asarray(b))):
                raise ValueError(
                    f"`{what}`: a NaN `{side}` bound at {at} (an open side is None or "
                    "+-inf)."
                )


def check_bounds(bounds: tuple[Any, Any], params: Params, *, what: str = "bounds"):
    """The checks of [`broadcast_bounds`][] (without building its arrays: NumPy views
    of the concrete bounds, no JAX operation, cheap enough for every eager call)."""
    if isinstance(bounds, (tuple, list)) and len(bounds) == 2:
        # Before the walk, which would report a complex bound as no prefix.
        check_bound_values(bounds, what=what)
    lower, upper = _per_param(bounds, params, what, _view)
    for path, p in jtu.tree_flatten_with_path(params)[0]:
        if is_param(p) and jnp.iscomplexobj(p):
            raise ValueError(
                f"`{what}`: box bounds need real params; the param at "
                f"{jtu.keystr(path) or 'the params'} is complex."
            )
    flat_l = jtu.tree_flatten_with_path(lower, is_leaf=lambda x: x is None)[0]
    flat_u = jtu.tree_leaves(upper, is_leaf=lambda x: x is None)
    for (path, lo), up in zip(flat_l, flat_u):
        if lo is not None and up is not None and np.any(lo > up):
            raise ValueError(
                f"`{what}`: lower > upper at {jtu.keystr(path) or 'the params'} (a box "
                "needs lower <= upper)."
            )


def broadcast_bounds(
    bounds: tuple[Any, Any], params: Params, *, what: str = "bounds"
) -> tuple[PyTree[Array], PyTree[Array]]:
    """`(lower, upper)`, each a PyTree prefix of `params` (a scalar or array bounds
    every element of the subtree it sits over; `None` or +-inf leaves a side open), as
    two trees of `params`' structure with one array per inexact param leaf (None
    elsewhere). Raises a `ValueError` naming the leaf where `lower > upper` or a
    bound is NaN, for
    complex params, and when a bound is not a prefix of `params`."""
    check_bounds(bounds, params, what=what)
    lower, upper = _per_param(bounds, params, what, _full)
    return lower, upper


def project_leaf(x: Array, lo: Array, up: Array) -> Array:
    """`x` clipped to `[lo, up]`, in `x`'s dtype. Inside the closed box (ties
    included) its derivative is 1, outside 0 (`jnp.clip` would give 1/2 at a tie)."""
    lo, up = lo.astype(x.dtype), up.astype(x.dtype)
    return jnp.where(x < lo, lo, jnp.where(x > up, up, x))


def project(params: Params, lower: PyTree[Array], upper: PyTree[Array]) -> Params:
    """The projection of `params` onto the box (bounds from `broadcast_bounds`)."""
    return tree_map(
        project_leaf, params, lower, upper, names=("params", "lower", "upper")
    )


class ProjectBox(AbstractOptimizer[EmptyState]):
    r"""Keep the params in the box $[\ell, u]$: each step is projected onto it. The
    incoming updates $u$ become

    $$P(p + u) - p, \qquad P(x) = \min(\max(x, \ell), u)$$

    (elementwise), so the new params $p + P(p + u) - p$ are the projection of the
    unconstrained ones. Put it last in a `Chain`, after the learning rate; it needs
    `params`. `lower` and `upper` are PyTree prefixes of the params (a scalar bounds
    every element; `None` or $\pm\infty$ leaves a side open). The sum is formed in the
    params' dtype, as `eqx.apply_updates` forms it, and the update is $\ell - p$ or
    $u - p$ exactly where the bound is active.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.array([0.2, 0.9]), "b": jnp.array([0.5])}
        grads = {"w": jnp.array([1.0, -1.0]), "b": jnp.array([0.1])}
        box = eqxopt.ProjectBox(0.0, {"w": 1.0, "b": None})  # b: only b >= 0
        opt = eqxopt.Chain(eqxopt.SGD(0.5), box)
        params, state = opt.step(params, grads, opt.init(params))
        assert jnp.array_equal(params["w"], jnp.array([0.0, 1.0]))  # clipped to [0, 1]
        ```
    """

    lower: Any = None
    upper: Any = None

    def __check_init__(self):
        # What can be checked without the params (the rest is checked at `update`,
        # where the bounds are broadcast over them).
        check_bound_values((self.lower, self.upper), what="ProjectBox")
        lo, up = self.lower, self.upper
        scalars = all(
            eqx.is_array_like(b) and not isinstance(b, Tracer) and np.ndim(b) == 0
            for b in (lo, up)
        )
        if scalars and np.asarray(lo) > np.asarray(up):
            raise ValueError(
                f"`ProjectBox`: lower > upper ({lo} > {up}): a box needs "
                "lower <= upper."
            )

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(
        self, grads: Updates, state: EmptyState, params: Params | None = None, **extra
    ) -> tuple[Updates, EmptyState]:
        if params is None:
            raise ValueError(
                "`ProjectBox.update` needs `params`: call `update(grads, state, "
                "params)`, or `step(model, grads, state)`."
            )
        lower, upper = broadcast_bounds(
            (self.lower, self.upper), params, what="ProjectBox"
        )

        def _leaf(u, p, lo, up):
            u = u.astype(out_dtype(u, p))
            new = project_leaf(p + u, lo, up)
            # `p + (new - p)` may round past the bound by an ulp: nudge it inside.
            v = new - p
            lo, up = lo.astype(p.dtype), up.astype(p.dtype)
            v = jnp.where(p + v < lo, jnp.nextafter(v, jnp.inf), v)
            v = jnp.where(p + v > up, jnp.nextafter(v, -jnp.inf), v)
            return jnp.where(new == p + u, u, v)

        return tree_map(
            _leaf,
            grads,
            params,
            lower,
            upper,
            names=("grads", "params", "lower", "upper"),
        ), state


ProjectBox.__init__.__doc__ = r"""**Arguments:**

- `lower`: the lower bounds $\ell$: a PyTree prefix of the params (scalars, arrays,
    `None` for none).
- `upper`: the upper bounds $u$, likewise.
"""
