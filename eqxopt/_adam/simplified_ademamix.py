"""Simplified AdEMAMix: Adam with an undamped gradient sum mixed with the gradient."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._filter_spec import decay_mask
from .._kernels import descent
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    mask_field,
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
class SimplifiedAdEMAMixState(eqx.Module):
    """State of [`eqxopt.SimplifiedAdEMAMix`][]: the step count, the (undamped)
    gradient accumulator `m` and the second moment `n`, one leaf per param (each may
    be quantized: [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.SimplifiedAdEMAMix(1e-3)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert jnp.array_equal(state.m["b"], grads["b"])  # m = b1 m + g, from 0
        ```
    """

    count: Int32[Array, ""]
    m: PyTree[Stored]
    n: PyTree[Stored]


class SimplifiedAdEMAMix(AbstractOptimizer[SimplifiedAdEMAMixState]):
    r"""Simplified AdEMAMix: one momentum buffer (an undamped sum of the gradients),
    mixed with the current gradient.

    $$m_k = \beta_1 m_{k-1} + g_k, \qquad
      n_k = \beta_2 n_{k-1} + (1-\beta_2)\,g_k^2$$

    $$u_k = -\eta_k \left(\frac{m_k + \alpha_k\, g_k}
      {\sqrt{n_k / (1-\beta_2^k) + \bar\epsilon} + \epsilon} + \lambda\, p_k\right)$$

    ($k$ from 1; $\alpha$ may be a schedule; the weight decay applies to the leaves
    `mask` selects). With $\alpha = 0$ it is Adam with a rescaled learning rate and
    $\beta_1$. Matches `optax.contrib.simplified_ademamix`.

    ??? cite "References"

        ```bibtex
        @inproceedings{morwani2025connections,
            title={Connections between Schedule-Free Optimizers, {AdEMAMix}, and
                Accelerated {SGD} Variants},
            author={Morwani, Depen and Vyas, Nikhil and Zhang, Hanlin and
                Kakade, Sham},
            booktitle={ICLR}, year={2025}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.SimplifiedAdEMAMix(1e-4, b1=0.99, alpha=10.0, weight_decay=0.1)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.99
    b2: ScalarLike = 0.95
    alpha: ScalarOrSchedule = 0.0
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 0.0
    weight_decay: ScalarLike = 0.0
    mask: FilterSpec | None = mask_field(default=None)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)

    _state_buffers = {"m": False, "n": True}

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "alpha", "eps", "eps_root", "weight_decay"),
            unit_interval=("b1", "b2"),
        )

    def init(self, params: Params) -> SimplifiedAdEMAMixState:
        return SimplifiedAdEMAMixState(
            zero_count(),
            buffers_like(params, self.state_dtype, "m", False),
            buffers_like(params, self.state_dtype, "n", True),
        )

    def update(
        self, grads: Updates, state: SimplifiedAdEMAMixState, params=None, **extra
    ):
        lr = resolve(self.learning_rate, state.count)
        alpha = resolve(self.alpha, state.count)
        count = increment(state.count)
        finish = descent(lr, self.weight_decay)
        mask = None if params is None else decay_mask(self.mask, params)

        def _constants(dtype):
            b2 = scalar(self.b2, dtype)
            return (
                scalar(self.b1, dtype),
                b2,
                1 - b2 ** count.astype(dtype),
                scalar(alpha, dtype),
                scalar(self.eps, dtype),
                scalar(self.eps_root, dtype),
            )

        constants = per_dtype(_constants)

        def _leaf(g, m, n, p, selected):
            dtype = compute_dtype(g.dtype, dtype_of(m), dtype_of(n))
            b1, b2, bc2, alpha_, eps, eps_root = constants(dtype)
            g32 = g.astype(dtype)
            g_sq = abs_sq(g32)
            new_m = g32 + b1 * read(m, dtype)
            # Optax's form: lerp(b2, g^2, n) = g^2 + b2 (n - g^2).
            new_n = g_sq + b2 * (read(n, dtype) - g_sq)
            direction = (new_m + alpha_ * g32) / (
                jnp.sqrt(new_n / bc2 + eps_root) + eps
            )
            update = finish(direction, g, p, selected)
            return pack(
                update.astype(out_dtype(g, p)),
                write(new_m, m),
                write(new_n, n),
            )

        updates, m, n = tree_map_unzip(
            _leaf,
            3,
            grads,
            state.m,
            state.n,
            params,
            mask,
            names=("grads", "state.m", "state.n", "params", "mask"),
        )
        return updates, SimplifiedAdEMAMixState(count, m, n)


SimplifiedAdEMAMix.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`.
- `b1`: decay rate $\beta_1$ of the gradient accumulator, in `[0, 1)`.
- `b2`: decay rate $\beta_2$ of the second moment, in `[0, 1)`.
- `alpha`: weight $\alpha$ of the current gradient; a number or a schedule.
- `eps`, `eps_root`: $\epsilon$ outside and $\bar\epsilon$ inside the root.
- `weight_decay`: $\lambda$ (multiplied by the learning rate).
- `mask`: which leaves are decayed, as a filter spec; default all.
- `state_dtype`: dtype of both buffers; default the param's. An
    [`eqxopt.Quantized`][] quantizes them, a dict keyed by `"m"` and `"n"` each.
    (Static, keyword-only; Optax's `simplified_ademamix` has no such option.)
"""
