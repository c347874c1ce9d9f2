"""LAMB (You et al. 2020): Adam whose step is scaled per layer by the trust ratio."""

import equinox as eqx

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._filter_spec import decay_mask
from .._kernels import is_zero, trust_ratio
from .._misc import (
    mask_field,
    per_dtype,
    resolve,
    scalar,
    zero_count,
)
from .._quantized import buffers_like
from .base import adam_family_step, adam_moments, AdamState


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
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "eps", "eps_root", "weight_decay"),
            unit_interval=("b1", "b2"),
        )

    _state_buffers = {"mu": False, "nu": True}

    def init(self, params: Params) -> AdamState:
        return AdamState(
            zero_count(),
            buffers_like(params, self.state_dtype, "mu", False),
            buffers_like(params, self.state_dtype, "nu", True),
        )

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


Lamb.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`.
- `b1`, `b2`: decay rates $\beta_1, \beta_2$ of the moments, in `[0, 1)`.
- `eps`: $\epsilon$, added to the denominator outside the root.
- `eps_root`: $\epsilon_{\rm root}$, added inside the root.
- `weight_decay`: $\lambda$; a number or a schedule.
- `mask`: which leaves are decayed, as a filter spec; default all.
- `state_dtype`: dtype of both moments; default the param's. (Static, keyword-only.)
"""
