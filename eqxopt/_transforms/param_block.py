"""Scaling each update by a statistic of its param block: `ScaleByParamBlockNorm`
and `ScaleByParamBlockRms`."""

import jax.numpy as jnp

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer, EmptyState
from .._custom_types import Params, ScalarLike, Updates
from .._misc import (
    abs_sq,
    compute_dtype,
    out_dtype,
    scalar,
    tree_map,
)


def _floored(value, floor):
    """`max(value, floor)`, written as Optax's `safe_norm` (value <= floor -> floor)."""
    return jnp.where(value <= floor, floor, value)


def _scale_by_param_block(opt, grads, params, reduce):
    """`g * max(sqrt(reduce(|p|^2)), min_scale)` per leaf: the block norm (`jnp.sum`)
    or the block RMS (`jnp.mean`) of that leaf's params."""
    need_params(opt, params)

    def _leaf(g, p):
        dtype = compute_dtype(g.dtype, p.dtype)
        size = jnp.sqrt(reduce(abs_sq(p.astype(dtype))))
        scale = _floored(size, scalar(opt.min_scale, dtype))
        return (g.astype(dtype) * scale).astype(out_dtype(g, p))

    return tree_map(_leaf, grads, params, names=("grads", "params"))


class ScaleByParamBlockNorm(AbstractOptimizer[EmptyState]):
    r"""Scale each leaf's update by the Frobenius norm of that leaf's params:
    $u \mapsto u \cdot \max(\|p\|_F, s_{\min})$. Needs `params`. Matches
    `optax.scale_by_param_block_norm`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByAdam(),
            eqxopt.ScaleByParamBlockNorm(),
            eqxopt.ScaleByLearningRate(1e-3),
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # each leaf's step is relative to the norm of that leaf
        ```
    """

    min_scale: ScalarLike = 1e-3

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("min_scale",))

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        return _scale_by_param_block(self, grads, params, jnp.sum), state


class ScaleByParamBlockRms(AbstractOptimizer[EmptyState]):
    r"""Scale each leaf's update by the root mean square of that leaf's params:
    $u \mapsto u \cdot \max(\operatorname{rms}(p), s_{\min})$. Needs `params`. Matches
    `optax.scale_by_param_block_rms`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByAdam(),
            eqxopt.ScaleByParamBlockRms(),
            eqxopt.ScaleByLearningRate(1e-3),
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    min_scale: ScalarLike = 1e-3

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("min_scale",))

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        return _scale_by_param_block(self, grads, params, jnp.mean), state


ScaleByParamBlockNorm.__init__.__doc__ = r"""**Arguments:**

- `min_scale`: the smallest scale $s_{\min}$; default `1e-3`.
"""
ScaleByParamBlockRms.__init__.__doc__ = ScaleByParamBlockNorm.__init__.__doc__
