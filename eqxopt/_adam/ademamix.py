"""AdEMAMix: Adam with a mixture of a fast and a slow gradient EMA."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._filter_spec import decay_mask
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    mask_field,
    out_dtype,
    pack,
    resolve,
    scalar,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, read, Stored, write


@typechecked
class AdEMAMixState(eqx.Module):
    """State of [`eqxopt.AdEMAMix`][]: the step count, the fast (`m1`) and slow (`m2`)
    gradient EMAs and the second moment `nu`, one leaf per param (each may be
    quantized: [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.AdEMAMix(1e-3).init(params)
        state.m1["w"], state.m2["w"]  # the fast and slow gradient EMAs
        state.nu["w"]  # the second moment
        ```
    """

    count: Int32[Array, ""]
    m1: PyTree[Stored]
    m2: PyTree[Stored]
    nu: PyTree[Stored]


class AdEMAMix(AbstractOptimizer[AdEMAMixState]):
    r"""AdEMAMix: AdamW whose numerator mixes a fast and a very slow EMA of the
    gradients, to keep using gradients from tens of thousands of steps ago.

    $$m^{(1)}_k = \beta_1 m^{(1)}_{k-1} + (1-\beta_1) g_k, \qquad
      m^{(2)}_k = \beta_3 m^{(2)}_{k-1} + (1-\beta_3) g_k, \qquad
      \nu_k = \beta_2 \nu_{k-1} + (1-\beta_2) g_k^2$$

    $$u_k = -\eta_k \left( \frac{\hat m^{(1)}_k + \alpha\, m^{(2)}_k}
      {\sqrt{\hat\nu_k + \epsilon_{\rm root}} + \epsilon} + \lambda\, p_k \right)$$

    with bias-corrected $\hat m^{(1)}, \hat\nu$ (the slow EMA is not corrected).
    `b3` and `alpha` may be schedules (the paper warms both up); the weight decay
    applies to the leaves `mask` selects. Matches `optax.contrib.ademamix`.

    ??? cite "References"

        ```bibtex
        @inproceedings{pagliardini2025ademamix,
            title={The {AdEMAMix} Optimizer: Better, Faster, Older},
            author={Pagliardini, Matteo and Ablin, Pierre and Grangier, David},
            booktitle={ICLR}, year={2025}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.AdEMAMix(1e-3, b3=0.9999, alpha=5.0, weight_decay=0.1)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    b3: ScalarOrSchedule = 0.9999
    alpha: ScalarOrSchedule = 5.0
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 0.0
    state_dtype: object = eqx.field(default=None, static=True)
    weight_decay: ScalarLike = 0.0
    mask: FilterSpec | None = mask_field(default=None)

    _state_buffers = {"m1": False, "m2": False, "nu": True}

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "alpha", "eps", "eps_root", "weight_decay"),
            unit_interval=("b1", "b2", "b3"),
        )

    def init(self, params: Params) -> AdEMAMixState:
        return AdEMAMixState(
            zero_count(),
            buffers_like(params, self.state_dtype, "m1", False),
            buffers_like(params, self.state_dtype, "m2", False),
            buffers_like(params, self.state_dtype, "nu", True),
        )

    def update(self, grads: Updates, state: AdEMAMixState, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)
        b3 = resolve(self.b3, state.count)
        alpha = resolve(self.alpha, state.count)
        count = increment(state.count)
        decay = not (
            isinstance(self.weight_decay, (int, float)) and not self.weight_decay
        )
        if decay:
            need_params(self, params, "for the weight decay")
        mask = decay_mask(self.mask, params) if decay else None

        def _leaf(g, m1, m2, nu, p, selected):
            dtype = compute_dtype(g.dtype, dtype_of(m1), dtype_of(m2), dtype_of(nu))
            g32 = g.astype(dtype)
            b1_, b2_, b3_ = (scalar(b, dtype) for b in (self.b1, self.b2, b3))
            t = count.astype(dtype)
            m1_32 = (1 - b1_) * g32 + b1_ * read(m1, dtype)
            m2_32 = (1 - b3_) * g32 + b3_ * read(m2, dtype)
            nu32 = (1 - b2_) * abs_sq(g32) + b2_ * read(nu, dtype)
            m1_hat = m1_32 / (1 - b1_**t)
            nu_hat = nu32 / (1 - b2_**t)
            u = (m1_hat + scalar(alpha, dtype) * m2_32) / (
                jnp.sqrt(nu_hat + scalar(self.eps_root, dtype))
                + scalar(self.eps, dtype)
            )
            if decay and selected is not False:
                u = u + scalar(self.weight_decay, dtype) * p.astype(dtype)
            u = u * -scalar(lr, dtype)
            return pack(
                u.astype(out_dtype(g, p)),
                write(m1_32, m1),
                write(m2_32, m2),
                write(nu32, nu),
            )

        updates, m1, m2, nu = tree_map_unzip(
            _leaf,
            4,
            grads,
            state.m1,
            state.m2,
            state.nu,
            params,
            mask,
            names=("grads", "state.m1", "state.m2", "state.nu", "params", "mask"),
        )
        return updates, AdEMAMixState(count, m1, m2, nu)


AdEMAMix.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule.
- `b1`: decay rate of the fast EMA, in `[0, 1)`.
- `b2`: decay rate of the second moment, in `[0, 1)`.
- `b3`: decay rate of the slow EMA, in `[0, 1)`; a number or a schedule.
- `alpha`: weight $\alpha$ of the slow EMA; a number or a schedule.
- `eps`, `eps_root`: $\epsilon$ outside and $\epsilon_{\rm root}$ inside the root.
- `state_dtype`: dtype of the three buffers (Optax's `mu_dtype`); default the
    param's. An [`eqxopt.Quantized`][] quantizes them, a dict keyed by `"m1"`, `"m2"`
    and `"nu"` each. (Static.)
- `weight_decay`: decoupled weight decay $\lambda$ (multiplied by $\eta$).
- `mask`: which leaves are decayed, as a filter spec; default all.
"""
