"""Layer-wise trust-ratio optimizers: LAMB, LARS and the `ScaleByTrustRatio` block."""

import equinox as eqx
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Inexact, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer, EmptyState
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._kernels import is_zero
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    mask_field,
    out_dtype,
    pack,
    per_dtype,
    resolve,
    resolve_filter_spec,
    scalar,
    tree_map,
    tree_map_unzip,
    typechecked,
    zero_count,
    zeros_like,
)
from .._transforms.trace import momentum_step
from .._transforms.weight_decay import decay_mask
from .adam import adam_family_step, adam_moments, AdamState


def _norm_at_least(x: Array, min_norm: ScalarLike) -> Array:
    """$\\max(\\|x\\|_2, n_{\\min})$ (as `optax.safe_norm`, forward)."""
    norm = jnp.sqrt(jnp.sum(abs_sq(x)))
    floor = scalar(min_norm, norm.dtype)
    return jnp.where(norm <= floor, floor, norm)


def trust_ratio(
    u: Array,
    p: Array,
    min_norm: ScalarLike = 0.0,
    coefficient: ScalarLike = 1.0,
    eps: ScalarLike = 0.0,
) -> Array:
    """$u \\cdot c\\,\\|p\\| / (\\|u\\| + \\epsilon)$, or $u$ where either norm is 0
    (both norms floored at `min_norm`). `u` is in the compute dtype."""
    p_norm = _norm_at_least(p.astype(u.dtype), min_norm)
    u_norm = _norm_at_least(u, min_norm)
    ratio = scalar(coefficient, u.dtype) * p_norm / (u_norm + scalar(eps, u.dtype))
    ratio = jnp.where((p_norm == 0) | (u_norm == 0), jnp.ones_like(ratio), ratio)
    return u * ratio


class ScaleByTrustRatio(AbstractOptimizer[EmptyState]):
    r"""Rescale each param leaf's update by its trust ratio:

    $$u \mapsto u \cdot \frac{c\,\max(\|p\|, n_{\min})}{\max(\|u\|, n_{\min}) +
      \epsilon}$$

    with norms over the whole leaf (a layer), and $u$ unchanged where either norm is
    zero. Needs `params`. Used by [`eqxopt.Lamb`][] and [`eqxopt.Lars`][]; matches
    `optax.scale_by_trust_ratio`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByAdam(),
            eqxopt.ScaleByTrustRatio(),
            eqxopt.ScaleByLearningRate(1e-3),
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # each leaf's step scaled by ||p|| / ||u||, as in LAMB
        ```
    """

    min_norm: ScalarLike = 0.0
    trust_coefficient: ScalarLike = 1.0
    eps: ScalarLike = 0.0

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("min_norm", "trust_coefficient", "eps"))

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        need_params(self, params)

        def _leaf(g, p):
            u = g.astype(compute_dtype(g.dtype, p.dtype))
            u = trust_ratio(u, p, self.min_norm, self.trust_coefficient, self.eps)
            return u.astype(out_dtype(g, p))

        return tree_map(_leaf, grads, params, names=("grads", "params")), state


class Lamb(AbstractOptimizer[AdamState]):
    r"""LAMB: Adam's direction plus decoupled weight decay, rescaled layer by layer by
    the trust ratio $\|p\| / \|r\|$.

    $$r_k = \frac{\hat m_k}{\sqrt{\hat v_k + \epsilon_{\rm root}} + \epsilon}
      + \lambda\,p_k, \qquad
      u_k = -\eta_k\,\frac{\|p_k\|}{\|r_k\|}\,r_k$$

    with $\hat m, \hat v$ as in [`eqxopt.Adam`][], norms over each param leaf, and ratio
    1 where either norm is zero. The weight decay applies to the leaves `mask` selects
    (a filter spec); the trust ratio to all. Needs `params`. Matches `optax.lamb`.

    ??? cite "References"

        ```bibtex
        @inproceedings{you2020large,
            title={Large Batch Optimization for Deep Learning: Training {BERT} in 76
                Minutes},
            author={You, Yang and Li, Jing and Reddi, Sashank and Hseu, Jonathan and
                Kumar, Sanjiv and Bhojanapalli, Srinadh and Song, Xiaodan and
                Demmel, James and Keutzer, Kurt and Hsieh, Cho-Jui},
            booktitle={ICLR}, year={2020}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Lamb(1e-3, weight_decay=1e-2, mask=lambda p: p.ndim > 1)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-6
    eps_root: ScalarLike = 0.0
    weight_decay: ScalarOrSchedule = 0.0
    mask: FilterSpec | None = mask_field(default=None)
    state_dtype: DTypeLike | None = eqx.field(default=None, static=True, kw_only=True)

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "eps", "eps_root", "weight_decay"),
            unit_interval=("b1", "b2"),
        )

    def init(self, params: Params) -> AdamState:
        zeros = lambda: zeros_like(params, self.state_dtype)
        return AdamState(zero_count(), zeros(), zeros())

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        need_params(self, params)
        lr = resolve(self.learning_rate, state.count)
        wd = resolve(self.weight_decay, state.count)

        neg_lr = per_dtype(lambda dtype: -scalar(lr, dtype))
        decay = per_dtype(lambda dtype: scalar(wd, dtype))
        decayed = not is_zero(wd)

        def finish(d, g, p, selected):
            if decayed and selected is not False:
                d = d + decay(d.dtype) * p.astype(d.dtype)
            return trust_ratio(d, p) * neg_lr(d.dtype)

        moments = adam_moments(self.b1, self.b2, self.eps, self.eps_root)
        mask = decay_mask(self.mask, params)
        return adam_family_step(grads, state, params, moments, finish, mask)


@typechecked
class LarsState(eqx.Module):
    """State of [`eqxopt.Lars`][]: the step count and the momentum buffer, one leaf per
    param.

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
    trace: PyTree[Inexact[Array, "..."]]


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
    state_dtype: DTypeLike | None = eqx.field(default=None, static=True, kw_only=True)

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "weight_decay", "trust_coefficient", "eps"),
            unit_interval=("momentum",),
        )

    def init(self, params: Params) -> LarsState:
        return LarsState(zero_count(), zeros_like(params, self.state_dtype))

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
            dtype = compute_dtype(g.dtype, p.dtype, t.dtype)
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


Lamb.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`.
- `b1`, `b2`: decay rates $\beta_1, \beta_2$ of the moments, in `[0, 1)`.
- `eps`: $\epsilon$, added to the denominator outside the root.
- `eps_root`: $\epsilon_{\rm root}$, added inside the root.
- `weight_decay`: $\lambda$; a number or a schedule.
- `mask`: which leaves are decayed, as a filter spec; default all.
- `state_dtype`: dtype of both moments; default the param's. (Static, keyword-only.)
"""
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
- `state_dtype`: dtype of the momentum buffer; default the param's. (Static,
    keyword-only.)
"""
ScaleByTrustRatio.__init__.__doc__ = r"""**Arguments:**

- `min_norm`: $n_{\min}$, the floor of both norms.
- `trust_coefficient`: $c$, the trust ratio's multiplier.
- `eps`: $\epsilon$ in the trust ratio's denominator.
"""
