"""Clipping: `Clip` (elementwise), `ClipByGlobalNorm` and `ClipByBlockRms`."""

import jax.numpy as jnp

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer, EmptyState
from .._custom_types import Params, ScalarLike, Updates
from .._misc import (
    abs_sq,
    clip_magnitude,
    compute_dtype,
    global_norm,
    out_dtype,
    per_dtype,
    real_dtype,
    scalar,
    tree_map,
)


class Clip(AbstractOptimizer[EmptyState]):
    r"""Clip every update element to $[-\delta, \delta]$. Matches `optax.clip`; a
    complex element keeps its phase and has its modulus clipped to $\delta$ (Optax's
    raises: complex numbers have no order).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.Clip(0.5), eqxopt.SGD(0.1))
        updates, state = opt.update(grads, opt.init(params))
        assert jnp.all(jnp.abs(updates["b"]) <= 0.1 * 0.5)  # each grad in [-0.5, 0.5]
        ```
    """

    max_delta: ScalarLike

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("max_delta",))

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        bounds = per_dtype(lambda dtype: scalar(self.max_delta, real_dtype(dtype)))

        def _leaf(g, p):
            dtype = compute_dtype(g.dtype)
            clipped = clip_magnitude(g.astype(dtype), bounds(dtype))
            return clipped.astype(out_dtype(g, p))

        return tree_map(_leaf, grads, params, names=("grads", "params")), state


class ClipByGlobalNorm(AbstractOptimizer[EmptyState]):
    r"""Rescale updates so that their global norm is at most `max_norm`:

    $$u \mapsto u \cdot \min(1, c / \|u\|_2)$$

    with the norm taken over all leaves together. Matches `optax.clip_by_global_norm`.

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.SGD(1.0))
        updates, state = opt.update(grads, opt.init(params))
        norm = jnp.sqrt(sum(jnp.sum(u**2) for u in jax.tree.leaves(updates)))
        assert norm <= 1.0 + 1e-6  # the norm over all leaves together
        ```
    """

    max_norm: ScalarLike

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("max_norm",))

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        norm = global_norm(grads)
        consts = per_dtype(
            lambda dtype: (norm.astype(dtype), scalar(self.max_norm, dtype))
        )

        def _leaf(g, p):
            dtype = compute_dtype(g.dtype, norm.dtype)
            n, c = consts(dtype)
            g32 = g.astype(dtype)
            return jnp.where(n < c, g32, (g32 / n) * c).astype(out_dtype(g, p))

        return tree_map(_leaf, grads, params, names=("grads", "params")), state


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


ClipByBlockRms.__init__.__doc__ = r"""**Arguments:**

- `threshold`: $c > 0$, the largest root mean square of a leaf's update.
"""
