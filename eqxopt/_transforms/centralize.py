"""Gradient centralization."""

import jax.numpy as jnp

from .._core.base import AbstractOptimizer, EmptyState
from .._custom_types import Params, Updates
from .._misc import (
    compute_dtype,
    out_dtype,
    tree_map,
)


class Centralize(AbstractOptimizer[EmptyState]):
    r"""Gradient centralization: subtract from each update its mean over every axis
    but the first.

    $$u_{i,\dots} \mapsto u_{i,\dots} - \operatorname{mean}_{\dots}\, u_{i,\dots}$$

    for leaves of rank 2 or more; vectors and scalars pass through. With Equinox's
    `(out, in, ...)` weight layout this centres each output unit's weights (per row
    of a `Linear` weight, per output channel of a `Conv`), as in the paper. Matches
    `optax.centralize`.

    ??? cite "References"

        ```bibtex
        @inproceedings{yong2020gradient,
            title={Gradient Centralization: A New Optimization Technique for Deep
                Neural Networks},
            author={Yong, Hongwei and Huang, Jianqiang and Hua, Xiansheng and
                Zhang, Lei},
            booktitle={ECCV}, year={2020}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.Centralize(), eqxopt.Adam(1e-3))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        def _leaf(g, p):
            if g.ndim <= 1:
                return g.astype(out_dtype(g, p))
            dtype = compute_dtype(g.dtype)
            g32 = g.astype(dtype)
            mean = jnp.mean(g32, axis=tuple(range(1, g.ndim)), keepdims=True)
            return (g32 - mean).astype(out_dtype(g, p))

        return tree_map(_leaf, grads, params, names=("grads", "params")), state


Centralize.__init__.__doc__ = "**Arguments:** none."
