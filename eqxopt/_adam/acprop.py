"""ACProp: AdaBelief's centred second moment, used one step late (asynchronously)."""

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
class AcPropState(eqx.Module):
    """State of [`eqxopt.AcProp`][]: the step count, the gradient EMA `mu` and the EMA
    `nu` of the squared prediction error $(g - m)^2$, one leaf per param (each may be
    quantized: [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.AcProp(1e-3)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert jnp.allclose(state.mu["b"], 0.1 * grads["b"])  # (1 - b1) g
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Stored]
    nu: PyTree[Stored]


class AcProp(AbstractOptimizer[AcPropState]):
    r"""ACProp: AdaBelief's second moment of the prediction error $g - m$, used
    asynchronously: the step at $k$ divides the *current* gradient by the second
    moment accumulated up to step $k-1$.

    $$m_k = \beta_1 m_{k-1} + (1-\beta_1)\,g_k, \qquad
      s_k = \beta_2 s_{k-1} + (1-\beta_2)\,(g_k - m_{k-1})^2 + \bar\epsilon$$

    $$u_k = -\eta_k \left(\frac{g_k}{\sqrt{s_{k-1} / (1-\beta_2^{k-1})} + \epsilon}
      + \lambda\,p_k\right)$$

    ($k$ from 1; at $k = 1$ the denominator's root is taken as 1, so the first step is
    $-\eta (g_1 / (1 + \epsilon) + \lambda p_1)$.) The weight decay applies to the
    leaves `mask` selects. Matches `optax.contrib.acprop` (which, as here, centres on
    the previous $m_{k-1}$).

    ??? cite "References"

        ```bibtex
        @inproceedings{zhuang2021acprop,
            title={Momentum Centering and Asynchronous Update for Adaptive Gradient
                Methods},
            author={Zhuang, Juntang and Ding, Yifan and Tang, Tommy and Dvornek,
                Nicha and Tatikonda, Sekhar and Duncan, James S.},
            booktitle={NeurIPS}, year={2021}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.AcProp(1e-3, weight_decay=1e-2, mask=lambda p: p.ndim > 1)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-16
    eps_root: ScalarLike = 1e-16
    weight_decay: ScalarLike = 0.0
    mask: FilterSpec | None = mask_field(default=None)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)

    _state_buffers = {"mu": False, "nu": True}

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "eps", "eps_root", "weight_decay"),
            unit_interval=("b1", "b2"),
        )

    def init(self, params: Params) -> AcPropState:
        return AcPropState(
            zero_count(),
            buffers_like(params, self.state_dtype, "mu", False),
            buffers_like(params, self.state_dtype, "nu", True),
        )

    def update(self, grads: Updates, state: AcPropState, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)
        finish = descent(lr, self.weight_decay)
        mask = None if params is None else decay_mask(self.mask, params)
        initial = state.count == 0
        # The bias correction of the *previous* second moment, at step max(k - 1, 1).
        t = jnp.where(initial, 1, state.count)

        def _constants(dtype):
            b1, b2 = scalar(self.b1, dtype), scalar(self.b2, dtype)
            return (
                b1,
                1 - b1,
                b2,
                1 - b2,
                1 - b2 ** t.astype(dtype),
                scalar(self.eps, dtype),
                scalar(self.eps_root, dtype),
            )

        constants = per_dtype(_constants)

        def _leaf(g, m, v, p, selected):
            dtype = compute_dtype(g.dtype, dtype_of(m), dtype_of(v))
            b1, one_minus_b1, b2, one_minus_b2, bc2, eps, eps_root = constants(dtype)
            g32, m32, v32 = g.astype(dtype), read(m, dtype), read(v, dtype)
            new_m = one_minus_b1 * g32 + b1 * m32
            new_v = one_minus_b2 * abs_sq(g32 - m32) + b2 * v32 + eps_root
            v_hat = jnp.where(initial, jnp.ones((), v32.dtype), v32 / bc2)
            direction = g32 / (jnp.sqrt(v_hat) + eps)
            update = finish(direction, g, p, selected)
            return pack(
                update.astype(out_dtype(g, p)),
                write(new_m, m),
                write(new_v, v),
            )

        updates, mu, nu = tree_map_unzip(
            _leaf,
            3,
            grads,
            state.mu,
            state.nu,
            params,
            mask,
            names=("grads", "state.mu", "state.nu", "params", "mask"),
        )
        return updates, AcPropState(increment(state.count), mu, nu)

    _write_after_params = ("mu", "nu")  # see `AbstractOptimizer.step`


AcProp.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`.
- `b1`: decay rate $\beta_1$ of the gradient EMA, in `[0, 1)`.
- `b2`: decay rate $\beta_2$ of the prediction-error EMA, in `[0, 1)`.
- `eps`: $\epsilon$, added to the denominator's root.
- `eps_root`: $\bar\epsilon$, added to the second moment at every step.
- `weight_decay`: $\lambda$ (multiplied by the learning rate).
- `mask`: which leaves are decayed, as a filter spec; default all.
- `state_dtype`: dtype of both moments; default the param's. An
    [`eqxopt.Quantized`][] quantizes them, a dict keyed by `"mu"` and `"nu"` each.
    (Static, keyword-only; Optax's `acprop` has no such option.)
"""
