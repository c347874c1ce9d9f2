"""Fromage: Frobenius-matched gradient descent."""

import jax.numpy as jnp

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer, CountState
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    out_dtype,
    resolve,
    scalar,
    tree_map,
    zero_count,
)


def _clipped_norm(x, min_norm):
    """`max(||x||_F, min_norm)` (Optax's `safe_norm`: no NaN gradient at 0)."""
    sq = jnp.sum(abs_sq(x))
    small = jnp.sqrt(sq) <= min_norm
    safe = jnp.sqrt(jnp.where(small, jnp.ones_like(sq), sq))
    return jnp.where(small, min_norm, safe)


class Fromage(AbstractOptimizer[CountState]):
    r"""Fromage: a per-layer relative step that keeps the weights' norm in check.

    For each leaf (layer) $p$ with gradient $g$,

    $$p_{k+1} = \frac{1}{\sqrt{1 + \eta_k^2}}
      \left(p_k - \eta_k\,\frac{\|p_k\|_F}{\|g_k\|_F}\, g_k\right)$$

    with both norms clipped below at `min_norm`. Returned as an update
    $u_k = p_{k+1} - p_k$. Matches `optax.fromage`.

    ??? cite "References"

        ```bibtex
        @inproceedings{bernstein2020distance,
            title={On the Distance between Two Neural Networks and the Stability of
                Learning},
            author={Bernstein, Jeremy and Vahdat, Arash and Yue, Yisong and
                Liu, Ming-Yu},
            booktitle={NeurIPS}, year={2020}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Fromage(learning_rate=0.01)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    min_norm: ScalarLike = 1e-6

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("learning_rate", "min_norm"))

    def init(self, params: Params) -> CountState:
        return CountState(zero_count())

    def update(self, grads: Updates, state: CountState, params=None, **extra):
        need_params(self, params, "for the trust ratio")
        lr = resolve(self.learning_rate, state.count)

        def _leaf(g, p):
            dtype = compute_dtype(g.dtype, p.dtype)
            g32, p32 = g.astype(dtype), p.astype(dtype)
            min_norm = scalar(self.min_norm, dtype)
            p_norm = _clipped_norm(p32, min_norm)
            g_norm = _clipped_norm(g32, min_norm)
            zero = (p_norm == 0) | (g_norm == 0)
            trust = jnp.where(zero, jnp.ones_like(p_norm), p_norm / g_norm)
            eta = scalar(lr, dtype)
            mult = 1 / jnp.sqrt(1 + eta * eta)
            u = (g32 * trust) * -(eta * mult) + (mult - 1) * p32
            return u.astype(out_dtype(g, p))

        updates = tree_map(_leaf, grads, params, names=("grads", "params"))
        return updates, CountState(increment(state.count))


Fromage.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule.
- `min_norm`: lower bound on both norms of the trust ratio, so that it never divides
    by zero.
"""
