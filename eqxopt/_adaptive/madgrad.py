"""MADGRAD: momentumised, adaptive, dual-averaged gradient descent."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Inexact, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._kernels import add_decay
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    out_dtype,
    pack,
    per_dtype,
    resolve,
    scalar,
    tree_map,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, read, Stored, write


@typechecked
class MadgradState(eqx.Module):
    """State of [`eqxopt.Madgrad`][]: the step count and, one leaf per param, the
    weighted sums `grad_sum_sq` of squared gradients and `s` of gradients, and the
    initial params `x0` (in the params' dtypes; the sums may be quantized:
    [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Madgrad(1e-2)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        state.s["w"], state.grad_sum_sq["w"]  # the dual averages
        assert jnp.array_equal(state.x0["w"], jnp.ones((2, 3)))  # the initial params
        ```
    """

    count: Int32[Array, ""]
    grad_sum_sq: PyTree[Stored]
    s: PyTree[Stored]
    x0: PyTree[Inexact[Array, "..."]]


class Madgrad(AbstractOptimizer[MadgradState]):
    r"""MADGRAD: dual averaging with a cube-root adaptive scaling and momentum.

    With $\lambda_k = (\eta_k + \epsilon)\sqrt{k + 1}$ ($k$ from 0) and
    $g_k$ including the L2 term $w\,p_k$,

    $$G_{k+1} = G_k + \lambda_k g_k^2, \qquad s_{k+1} = s_k + \lambda_k g_k, \qquad
      z_{k+1} = p_0 - \frac{s_{k+1}}{G_{k+1}^{1/3} + \epsilon}$$

    $$p_{k+1} = (1 - \mu)\,z_{k+1} + \mu\, p_k$$

    and the update is $u_k = p_{k+1} - p_k$ ($\mu$ = `momentum`). Needs `params` in
    `update`. Matches `optax.contrib.madgrad`.

    ??? cite "References"

        ```bibtex
        @article{defazio2022madgrad,
            title={Adaptivity without Compromise: A Momentumized, Adaptive, Dual
                Averaged Gradient Method for Stochastic Optimization},
            author={Defazio, Aaron and Jelassi, Samy},
            journal={JMLR}, volume={23}, number={144}, year={2022}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Madgrad(1e-2, momentum=0.9, weight_decay=1e-4)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    momentum: ScalarLike = 0.9
    weight_decay: ScalarLike = 0.0
    eps: ScalarLike = 1e-6
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)

    _state_buffers = {"grad_sum_sq": True, "s": False}

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "weight_decay", "eps"),
            unit_interval=("momentum",),
        )

    def init(self, params: Params) -> MadgradState:
        return MadgradState(
            zero_count(),
            buffers_like(params, self.state_dtype, "grad_sum_sq", True),
            buffers_like(params, self.state_dtype, "s", False),
            # A copy, not the params' own buffers, so that (params, state) can be
            # donated to a jitted step.
            tree_map(lambda p: jnp.array(p, copy=True), params),
        )

    def update(self, grads: Updates, state: MadgradState, params=None, **extra):
        need_params(self, params, "MADGRAD steps from the initial params")
        lr = resolve(self.learning_rate, state.count)

        def _constants(dtype):
            eps = scalar(self.eps, dtype)
            lamb = (scalar(lr, dtype) + eps) * jnp.sqrt((state.count + 1).astype(dtype))
            return lamb, eps, scalar(self.momentum, dtype)

        constants = per_dtype(_constants)

        def _leaf(g, G, s, x0, p):
            dtype = compute_dtype(g.dtype, dtype_of(G), dtype_of(s), x0.dtype, p.dtype)
            lamb, eps, momentum = constants(dtype)
            p32 = p.astype(dtype)
            g32 = add_decay(g.astype(dtype), p32, self.weight_decay, None)
            new_G = read(G, dtype) + lamb * abs_sq(g32)
            new_s = read(s, dtype) + lamb * g32
            # G sums |g|^2: real, also where its state is complex-typed.
            z = x0.astype(dtype) - new_s / (jnp.cbrt(jnp.real(new_G)) + eps)
            new_p = (1 - momentum) * z + momentum * p32
            return pack(
                (new_p - p32).astype(out_dtype(g, p)),
                write(new_G, G),
                write(new_s, s),
            )

        updates, grad_sum_sq, s = tree_map_unzip(
            _leaf,
            3,
            grads,
            state.grad_sum_sq,
            state.s,
            state.x0,
            params,
            names=("grads", "state.grad_sum_sq", "state.s", "state.x0", "params"),
        )
        return updates, MadgradState(increment(state.count), grad_sum_sq, s, state.x0)


Madgrad.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`.
- `momentum`: $\mu$, in `[0, 1)`.
- `weight_decay`: $w$, an L2 penalty added to the gradients.
- `eps`: $\epsilon$, added to the learning rate and to the cube root.
- `state_dtype`: dtype of the two sums; default the param's. An
    [`eqxopt.Quantized`][] quantizes them, a dict keyed by `"grad_sum_sq"` and `"s"`
    each. (Static, keyword-only; Optax's `madgrad` has no such option.)
"""
