"""`ProjectBox`: keep params inside a box while training (`P(p + u) - p`)."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from .._bounds import broadcast_bounds, check_bound_values, project_leaf
from .._core.base import AbstractOptimizer, EmptyState
from .._custom_types import Params, Updates
from .._misc import out_dtype, tree_map


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
