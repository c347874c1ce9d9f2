"""Small per-block scalings and normalisations: `ScaleByParamBlockNorm`,
`ScaleByParamBlockRms`, `ClipByBlockRms`, `NormalizeByUpdateNorm`."""

import jax.numpy as jnp

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer, EmptyState
from .._custom_types import Params, ScalarLike, Updates
from .._misc import (
    abs_sq,
    compute_dtype,
    global_norm,
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


class ClipByBlockRms(AbstractOptimizer[EmptyState]):
    r"""Clip each leaf's update to a root mean square of at most `threshold`:
    $u \mapsto u / \max(1, \operatorname{rms}(u) / c)$. Matches
    `optax.clip_by_block_rms`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.ClipByBlockRms(0.1), eqxopt.SGD(1.0))
        updates, state = opt.update(grads, opt.init(params))
        rms = jnp.sqrt(jnp.mean(updates["b"] ** 2))
        assert rms <= 0.1 + 1e-6  # each leaf clipped to an RMS of at most 0.1
        ```
    """

    threshold: ScalarLike

    def __check_init__(self):
        check_hyperparams(self, positive=("threshold",))

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        def _leaf(g, p):
            dtype = compute_dtype(g.dtype)
            g32 = g.astype(dtype)
            rms = jnp.sqrt(jnp.mean(abs_sq(g32)))
            denom = jnp.maximum(
                jnp.ones((), rms.dtype), rms / scalar(self.threshold, rms.dtype)
            )
            return (g32 / denom.astype(dtype)).astype(out_dtype(g, p))

        return tree_map(_leaf, grads, params, names=("grads", "params")), state


class NormalizeByUpdateNorm(AbstractOptimizer[EmptyState]):
    r"""Normalise the updates by their global norm:
    $u \mapsto s\, u / (\|u\|_2 + \epsilon)$, the norm taken over all leaves together.
    With `scale_factor=-lr` this is normalised gradient descent. Matches
    `optax.normalize_by_update_norm`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.NormalizeByUpdateNorm(), eqxopt.ScaleByLearningRate(0.1)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)  # a step of length 0.1
        ```
    """

    scale_factor: ScalarLike = 1.0
    eps: ScalarLike = 1e-6

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("eps",))

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        norm = global_norm(grads)

        def _leaf(g, p):
            dtype = compute_dtype(g.dtype, norm.dtype)
            denom = (norm.astype(dtype) + scalar(self.eps, dtype)) / scalar(
                self.scale_factor, dtype
            )
            return (g.astype(dtype) / denom).astype(out_dtype(g, p))

        return tree_map(_leaf, grads, params, names=("grads", "params")), state


ScaleByParamBlockNorm.__init__.__doc__ = r"""**Arguments:**

- `min_scale`: the smallest scale $s_{\min}$; default `1e-3`.
"""
ScaleByParamBlockRms.__init__.__doc__ = ScaleByParamBlockNorm.__init__.__doc__
ClipByBlockRms.__init__.__doc__ = r"""**Arguments:**

- `threshold`: $c > 0$, the largest root mean square of a leaf's update.
"""
NormalizeByUpdateNorm.__init__.__doc__ = r"""**Arguments:**

- `scale_factor`: $s$, multiplies the normalised update (e.g. `-lr`); default `1`.
- `eps`: $\epsilon \ge 0$, added to the norm; default `1e-6`.
"""
