"""Projection onto the nonnegative orthant."""

import jax.numpy as jnp

from .._checks import need_params
from .._core.base import AbstractOptimizer, EmptyState
from .._custom_types import Params, Updates
from .._misc import (
    out_dtype,
    tree_map,
)


class KeepParamsNonnegative(AbstractOptimizer[EmptyState]):
    r"""Modify the updates so that the params stay nonnegative: where $p + u < 0$ the
    update becomes $-p$ (the param is set to 0).

    Put it last in a `Chain`, after the learning rate. The params must start
    nonnegative. Matches `optax.keep_params_nonnegative`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.SGD(1.0), eqxopt.KeepParamsNonnegative())
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert jnp.all(params["b"] >= 0)  # would be -1 without the projection
        ```
    """

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        need_params(self, params)

        def _leaf(u, p):
            # Test the sum exactly as `eqx.apply_updates` will compute it, in the
            # params' dtype, so that rounding can never make a param negative.
            u = u.astype(out_dtype(u, p))
            return jnp.where(p + u < 0, -p, u)

        return tree_map(_leaf, grads, params, names=("grads", "params")), state


KeepParamsNonnegative.__init__.__doc__ = "**Arguments:** none."
