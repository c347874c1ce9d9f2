"""Normalisations of the updates: `Normalize` (by the gradients' global norm) and
`NormalizeByUpdateNorm`."""

import jax.numpy as jnp

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer, EmptyState
from .._custom_types import Params, ScalarLike, Updates
from .._misc import (
    compute_dtype,
    global_norm,
    out_dtype,
    scalar,
    tree_map,
    tree_sum_of_squares,
)


class Normalize(AbstractOptimizer[EmptyState]):
    r"""Scale the incoming updates to unit global norm: $u = g / \|g\|$, the norm taken
    over the whole PyTree.

    Stateless. Matches `optax.contrib.normalize` (the normalisation that
    `optax.contrib.sam` uses for its adversarial step), except where every entry of
    $g$ is zero: a zero vector has no direction, and the update is zero (Optax's
    divides by zero there, and its NaN reaches the params).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.Normalize(), eqxopt.ScaleByLearningRate(0.1))
        state = opt.init(params)
        updates, state = opt.update(grads, state, params)
        norm = jnp.sqrt(sum(jnp.sum(u**2) for u in updates.values()))
        assert jnp.allclose(norm, 0.1)  # a step of length exactly 0.1
        ```
    """

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        norm = jnp.sqrt(tree_sum_of_squares(grads))

        def _leaf(g, p):
            dtype = compute_dtype(g.dtype, norm.dtype)
            n = norm.astype(dtype)
            u = jnp.where(n > 0, g.astype(dtype) / n, jnp.zeros((), dtype))
            return u.astype(out_dtype(g, p))

        return tree_map(_leaf, grads, params, names=("grads", "params")), state


Normalize.__init__.__doc__ = r"""**Arguments:** none."""


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


NormalizeByUpdateNorm.__init__.__doc__ = r"""**Arguments:**

- `scale_factor`: $s$, multiplies the normalised update (e.g. `-lr`); default `1`.
- `eps`: $\epsilon \ge 0$, added to the norm; default `1e-6`.
"""
