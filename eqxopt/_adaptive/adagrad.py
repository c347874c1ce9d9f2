"""Adagrad (and its building block `ScaleByRss`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    out_dtype,
    pack,
    per_dtype,
    resolve,
    scalar,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, read, Stored, write


@typechecked
class AdagradState(eqx.Module):
    """State of [`eqxopt.Adagrad`][] and [`eqxopt.ScaleByRss`][]: the step count and
    the running sum of squared gradients, one leaf per param.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Adagrad(0.1, initial_accumulator_value=0.0)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert jnp.allclose(state.sum_of_squares["b"], grads["b"] ** 2)
        ```
    """

    count: Int32[Array, ""]
    sum_of_squares: PyTree[Stored]


def _check(opt):
    check_hyperparams(
        opt,
        nonnegative=("initial_accumulator_value", "eps")
        + (("learning_rate",) if hasattr(opt, "learning_rate") else ()),
    )


def _init(opt, params) -> AdagradState:
    return AdagradState(
        zero_count(),
        buffers_like(
            params,
            opt.state_dtype,
            "sum_of_squares",
            True,
            opt.initial_accumulator_value,
        ),
    )


def _rss_step(opt, grads, state: AdagradState, params, lr=None):
    def _constants(dtype):
        return scalar(opt.eps, dtype), None if lr is None else -scalar(lr, dtype)

    constants = per_dtype(_constants)  # traced once per update, not once per leaf

    def _leaf(g, s, p):
        dtype = compute_dtype(g.dtype, dtype_of(s))
        eps, neg_lr = constants(dtype)
        g32 = g.astype(dtype)
        s32 = abs_sq(g32) + read(s, dtype)
        scale = jnp.where(s32 > 0, jax.lax.rsqrt(s32 + eps), 0)
        update = scale * g32
        if neg_lr is not None:
            update = update * neg_lr
        return pack(update.astype(out_dtype(g, p)), write(s32, s))

    updates, sum_of_squares = tree_map_unzip(
        _leaf,
        2,
        grads,
        state.sum_of_squares,
        params,
        names=("grads", "state.sum_of_squares", "params"),
    )
    return updates, AdagradState(increment(state.count), sum_of_squares)


class ScaleByRss(AbstractOptimizer[AdagradState]):
    r"""Divide updates by the root of the sum of all squared gradients so far:

    $$s_k = s_{k-1} + g_k^2, \qquad u_k = \frac{g_k}{\sqrt{s_k + \epsilon}}$$

    (and $u_k = 0$ where $s_k = 0$). Matches `optax.scale_by_rss`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByRss(initial_accumulator_value=0.1),
            eqxopt.ScaleByLearningRate(0.1),
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    initial_accumulator_value: ScalarLike = 0.1
    eps: ScalarLike = 1e-7
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)

    _state_buffers = {"sum_of_squares": True}

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdagradState:
        return _init(self, params)

    def update(self, grads: Updates, state: AdagradState, params=None, **extra):
        return _rss_step(self, grads, state, params)


class Adagrad(AbstractOptimizer[AdagradState]):
    r"""Adagrad: per-coordinate step sizes from the sum of all past squared gradients.

    $$s_k = s_{k-1} + g_k^2, \qquad u_k = -\eta_k\,\frac{g_k}{\sqrt{s_k + \epsilon}}$$

    with $s_0$ = `initial_accumulator_value` (and $u_k = 0$ where $s_k = 0$). The sum
    only grows, so the effective step size decays over training. Matches
    `optax.adagrad`.

    ??? cite "References"

        ```bibtex
        @article{duchi2011adaptive,
            title={Adaptive Subgradient Methods for Online Learning and Stochastic
                Optimization},
            author={Duchi, John and Hazan, Elad and Singer, Yoram},
            journal={JMLR}, volume={12}, pages={2121--2159}, year={2011}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Adagrad(0.1, initial_accumulator_value=0.0)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    initial_accumulator_value: ScalarLike = 0.1
    eps: ScalarLike = 1e-7
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)

    _state_buffers = {"sum_of_squares": True}

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdagradState:
        return _init(self, params)

    def update(self, grads: Updates, state: AdagradState, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)
        return _rss_step(self, grads, state, params, lr)


_ARGS = r"""- `initial_accumulator_value`: $s_0$, `>= 0`.
- `eps`: $\epsilon$, added inside the root.
- `state_dtype`: dtype of the accumulator; default the param's. (Static,
    keyword-only.)
"""
Adagrad.__init__.__doc__ = (
    "**Arguments:**\n\n"
    r"- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`."
    "\n" + _ARGS
)
ScaleByRss.__init__.__doc__ = "**Arguments:**\n\n" + _ARGS
