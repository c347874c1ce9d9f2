r"""LARS (You et al. 2017): SGD with momentum whose step is scaled per layer by the
trust ratio $\|p\| / \|g\|$."""

import equinox as eqx
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._filter_spec import decay_mask
from .._kernels import is_zero, momentum_step, trust_ratio
from .._misc import (
    compute_dtype,
    increment,
    mask_field,
    out_dtype,
    pack,
    per_dtype,
    resolve,
    resolve_filter_spec,
    scalar,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, Stored


@typechecked
class LarsState(eqx.Module):
    """State of [`eqxopt.Lars`][]: the step count and the momentum buffer, one leaf per
    param (it may be quantized: [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.Lars(0.1, momentum=0.9).init(params)
        state.count  # the step count
        state.trace["w"]  # the momentum buffer
        ```
    """

    count: Int32[Array, ""]
    trace: PyTree[Stored]


class Lars(AbstractOptimizer[LarsState]):
    r"""LARS: SGD with momentum, each layer's step rescaled by its trust ratio.

    $$r_k = g_k + \lambda\,p_k, \qquad
      s_k = -\eta_k\,\frac{c\,\|p_k\|}{\|r_k\| + \epsilon}\,r_k$$

    $$t_k = s_k + \gamma\,t_{k-1}, \qquad u_k = t_k \quad
      (\text{Nesterov: } u_k = s_k + \gamma\,t_k)$$

    with norms over each param leaf and ratio 1 where either norm is zero. The weight
    decay applies to the leaves `weight_decay_mask` selects, the trust ratio to those
    `trust_ratio_mask` selects (filter specs; default all). As in Optax, the momentum
    accumulates learning-rate-scaled steps. Needs `params`. Matches `optax.lars`.

    ??? cite "References"

        ```bibtex
        @article{you2017large,
            title={Large Batch Training of Convolutional Networks},
            author={You, Yang and Gitman, Igor and Ginsburg, Boris},
            journal={arXiv:1708.03888}, year={2017}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Lars(0.1, weight_decay=1e-4, trust_ratio_mask=lambda p: p.ndim > 1)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    weight_decay: ScalarOrSchedule = 0.0
    weight_decay_mask: FilterSpec = mask_field(default=True)
    trust_coefficient: ScalarLike = 0.001
    eps: ScalarLike = 0.0
    trust_ratio_mask: FilterSpec = mask_field(default=True)
    momentum: ScalarLike = 0.9
    nesterov: bool = eqx.field(default=False, static=True)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)

    _state_buffers = {"trace": False}

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "weight_decay", "trust_coefficient", "eps"),
            unit_interval=("momentum",),
        )

    def init(self, params: Params) -> LarsState:
        trace = buffers_like(params, self.state_dtype, "trace", False)
        return LarsState(zero_count(), trace)

    def update(self, grads: Updates, state: LarsState, params=None, **extra):
        need_params(self, params)
        lr = resolve(self.learning_rate, state.count)
        wd = resolve(self.weight_decay, state.count)
        wd_mask = decay_mask(self.weight_decay_mask, params)
        tr_mask = resolve_filter_spec(
            self.trust_ratio_mask, params, what="`trust_ratio_mask`", bools=True
        )

        def _constants(dtype):
            return (
                scalar(wd, dtype),
                scalar(self.trust_coefficient, dtype),
                scalar(self.eps, dtype),
                -scalar(lr, dtype),
            )

        constants = per_dtype(_constants)  # traced once per update, not per leaf
        decays = not is_zero(wd)

        def _leaf(g, t, p, decayed, trusted):
            dtype = compute_dtype(g.dtype, p.dtype, dtype_of(t))
            wd_, coefficient, eps, neg_lr = constants(dtype)
            r = g.astype(dtype)
            if decays and decayed is not False:
                r = r + wd_ * p.astype(dtype)
            if trusted is not False:
                r = trust_ratio(r, p, 0.0, coefficient, eps)
            step = r * neg_lr
            direction, t = momentum_step(step, t, self.momentum, self.nesterov)
            return pack(direction.astype(out_dtype(g, p)), t)

        updates, trace = tree_map_unzip(
            _leaf,
            2,
            grads,
            state.trace,
            params,
            wd_mask,
            tr_mask,
            names=(
                "grads",
                "state.trace",
                "params",
                "weight_decay_mask",
                "trust_ratio_mask",
            ),
        )
        return updates, LarsState(increment(state.count), trace)


Lars.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`.
- `weight_decay`: $\lambda$; a number or a schedule.
- `weight_decay_mask`: which leaves are decayed, as a filter spec; default all.
- `trust_coefficient`: $c$, the trust ratio's multiplier.
- `eps`: $\epsilon$ in the trust ratio's denominator.
- `trust_ratio_mask`: which leaves get the trust ratio, as a filter spec; default
    all.
- `momentum`: heavy-ball decay $\gamma$, in `[0, 1)`.
- `nesterov`: use Nesterov momentum. (Static.)
- `state_dtype`: dtype of the momentum buffer; default the param's. An
    [`eqxopt.Quantized`][] (or a dict `{"trace": ...}`) quantizes it. (Static,
    keyword-only.)
"""
