"""SGD with the Polyak step size, and the `ScaleByPolyak` building block."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer, CountState, EmptyState
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    compute_dtype,
    increment,
    is_param,
    out_dtype,
    resolve,
    scalar,
    tree_map,
    tree_sum_of_squares,
    zero_count,
)


_VARIANTS = ("sps", "sps+")
# Optax compares against the float64 machine epsilon whatever the dtype.
_TINY = float(np.finfo(np.float64).eps)


def _value(opt, extra: dict):
    if "value" not in extra:
        raise ValueError(
            f"`{type(opt).__name__}.update` needs the loss at `params`: call "
            "`update(grads, state, params, value=loss)`."
        )
    return extra["value"]


def _polyak_step(opt, grads, value, s=None):
    """The Polyak step size for the updates `s * grads` (`s=None`: 1), as a 0-d array
    in at least float32."""
    sq = tree_sum_of_squares(grads)
    dtype = sq.dtype if s is None else compute_dtype(sq.dtype, s.dtype)
    sq = sq.astype(dtype)
    if s is not None:
        s = s.astype(dtype)
        sq = sq * (s * s)
    gap = jnp.asarray(value).astype(dtype) - scalar(opt.f_min, dtype)
    if opt.variant == "sps+":
        gap = jnp.maximum(gap, jnp.zeros((), dtype))
    denom = sq + scalar(opt.eps, dtype)
    step = jnp.minimum(gap / denom, scalar(opt.max_learning_rate, dtype))
    return jnp.where(denom <= _TINY, jnp.zeros((), dtype), step)


def _scaled(tree, params, step, factor=None):
    def _leaf(g, p):
        dtype = compute_dtype(g.dtype, step.dtype)
        u = g.astype(dtype)
        if factor is not None:
            u = u * factor(dtype)
        return (u * step.astype(dtype)).astype(out_dtype(g, p))

    return tree_map(_leaf, tree, params, names=("grads", "params"))


class ScaleByPolyak(AbstractOptimizer[EmptyState]):
    r"""Scale updates by the Polyak step size
    $\min\{(f(x) - f^\star)/(\|u\|^2 + \epsilon),\ \gamma_{\max}\}$ (no sign flip).

    Needs the loss as `update(..., value=loss)`. Matches `optax.scale_by_polyak`.

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt


        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}


        def loss(p):
            return jnp.sum(p["w"] ** 2) + jnp.sum(p["b"] ** 2)


        opt = eqxopt.Chain(eqxopt.ScaleByPolyak(f_min=0.0), eqxopt.Scale(-1.0))
        state = opt.init(params)
        value, grads = jax.value_and_grad(loss)(params)
        params, state = opt.step(params, grads, state, value=value)
        ```
    """

    f_min: ScalarLike = 0.0
    max_learning_rate: ScalarLike = 1.0
    eps: ScalarLike = 0.0
    variant: str = eqx.field(default="sps", static=True)

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("max_learning_rate", "eps"),
            choices={"variant": _VARIANTS},
        )

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        step = _polyak_step(self, grads, _value(self, extra))
        return _scaled(grads, params, step), state


class PolyakSGD(AbstractOptimizer[CountState]):
    r"""SGD with the (stochastic) Polyak step size.

    $$\gamma_k = \min\left\{\frac{f(x_k) - f^\star}{s_k^2\|g_k\|^2 + \epsilon},\
      \gamma_{\max}\right\}, \qquad u_k = -\gamma_k\, s_k\, g_k$$

    where $s_k$ is `scaling` (a number or a schedule), $f^\star$ is `f_min`, and
    `variant="sps+"` uses the positive part of $f(x_k) - f^\star$. The step is 0 when
    the denominator vanishes. `update` needs the loss at `params`:
    `opt.update(grads, state, params, value=loss)` (or `opt.step(model, grads, state,
    value=loss)`). Matches `optax.polyak_sgd`.

    ??? cite "References"

        ```bibtex
        @inproceedings{loizou2021stochastic,
            title={Stochastic Polyak Step-size for {SGD}: An Adaptive Learning Rate for
                Fast Convergence},
            author={Loizou, Nicolas and Vaswani, Sharan and Laradji, Issam Hadj and
                Lacoste-Julien, Simon},
            booktitle={AISTATS}, year={2021}}
        ```

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt


        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}


        def loss(p):
            return jnp.sum(p["w"] ** 2) + jnp.sum(p["b"] ** 2)


        opt = eqxopt.PolyakSGD(max_learning_rate=1.0, f_min=0.0)
        state = opt.init(params)
        value, grads = jax.value_and_grad(loss)(params)
        params, state = opt.step(params, grads, state, value=value)
        ```
    """

    max_learning_rate: ScalarLike = 1.0
    scaling: ScalarOrSchedule = 1.0
    f_min: ScalarLike = 0.0
    eps: ScalarLike = 0.0
    variant: str = eqx.field(default="sps", static=True)

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("max_learning_rate", "scaling", "eps"),
            choices={"variant": _VARIANTS},
        )

    def init(self, params: Params) -> CountState:
        return CountState(zero_count())

    def update(self, grads: Updates, state: CountState, params=None, **extra):
        value = _value(self, extra)
        s = resolve(self.scaling, state.count)
        # Optax chains `sgd(scaling)` before the Polyak step, so the norm in the step
        # size is that of `-s * g`: |s g|^2 = s^2 |g|^2.
        leaves = [g for g in jax.tree_util.tree_leaves(grads) if is_param(g)]
        s32 = scalar(s, compute_dtype(*(g.dtype for g in leaves)))
        step = _polyak_step(self, grads, value, s32)
        updates = _scaled(grads, params, step, lambda d: -s32.astype(d))
        return updates, CountState(increment(state.count))


ScaleByPolyak.__init__.__doc__ = r"""**Arguments:**

- `f_min`: a lower bound $f^\star$ on the loss; default `0`.
- `max_learning_rate`: the largest step $\gamma_{\max}$; default `1`.
- `eps`: added to the denominator; default `0`.
- `variant`: `"sps"` or `"sps+"` (positive part of the gap).
"""
PolyakSGD.__init__.__doc__ = r"""**Arguments:**

- `max_learning_rate`: the largest step $\gamma_{\max}$; default `1`.
- `scaling`: a global factor $s_k$, a number or a schedule; default `1`.
- `f_min`: a lower bound $f^\star$ on the loss (`0` for models that interpolate the
    data); default `0`.
- `eps`: added to the denominator; default `0`.
- `variant`: `"sps"` or `"sps+"` (positive part of the gap).
"""
