"""Adam and AdamW (Kingma & Ba 2015; Loshchilov & Hutter 2019), and the
`ScaleByAdam` building block they share."""

from typing import TYPE_CHECKING

import equinox as eqx

from .._custom_types import FilterSpec, ScalarLike, ScalarOrSchedule
from .._misc import (
    mask_field,
)
from .base import AbstractAdam


# Abstract fields: type checkers see a `ClassVar` (as equinox does for its
# `AbstractClassVar`), so that their model of a final class's `__init__` takes its
# fields, in Optax's order, from the final class alone, as equinox does at run time.
if TYPE_CHECKING:
    pass
else:
    pass


class ScaleByAdam(AbstractAdam):
    r"""Adam's preconditioning without the learning rate: the update is the
    bias-corrected $\hat m / (\sqrt{\hat v + \epsilon_{\rm root}} + \epsilon)$.
    Matches `optax.scale_by_adam`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByAdam(b1=0.9, b2=0.999), eqxopt.ScaleByLearningRate(1e-3)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # the same updates as eqxopt.Adam(1e-3)
        ```
    """

    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 0.0
    state_dtype: object = eqx.field(default=None, static=True)
    nesterov: bool = eqx.field(default=False, static=True, kw_only=True)


class Adam(AbstractAdam):
    r"""Adam: per-coordinate step sizes from running moments of the gradient.

    $$m_k = \beta_1 m_{k-1} + (1-\beta_1) g_k, \qquad
      v_k = \beta_2 v_{k-1} + (1-\beta_2) g_k^2$$

    $$u_k = -\eta_k\, \frac{\hat m_k}{\sqrt{\hat v_k + \epsilon_{\rm root}} + \epsilon},
      \qquad \hat m_k = \frac{m_k}{1-\beta_1^k},\ \hat v_k = \frac{v_k}{1-\beta_2^k}$$

    Defaults and `nesterov` (NAdam-style look-ahead) follow `optax.adam`; `state_dtype`
    (Optax's `mu_dtype`) sets the dtype of both moments.

    ??? cite "References"

        ```bibtex
        @inproceedings{kingma2015adam,
            title={Adam: A Method for Stochastic Optimization},
            author={Kingma, Diederik P. and Ba, Jimmy},
            booktitle={ICLR}, year={2015}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Adam(eqxopt.schedules.CosineDecay(1e-3, decay_steps=1000))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 0.0
    state_dtype: object = eqx.field(default=None, static=True)
    nesterov: bool = eqx.field(default=False, static=True, kw_only=True)


class AdamW(AbstractAdam):
    r"""Adam with decoupled weight decay.

    $$u_k = -\eta_k \left( \frac{\hat m_k}{\sqrt{\hat v_k + \epsilon_{\rm root}}
      + \epsilon} + \lambda\, p_k \right)$$

    with $m, v$ as in [`eqxopt.Adam`][]; the decay applies only to the leaves `mask`
    selects (a filter spec: a PyTree prefix of the params with bools, or a per-leaf
    callable such as `lambda p: p.ndim > 1`). Defaults follow `optax.adamw`
    (`weight_decay=1e-4`).

    ??? cite "References"

        ```bibtex
        @inproceedings{loshchilov2019decoupled,
            title={Decoupled Weight Decay Regularization},
            author={Loshchilov, Ilya and Hutter, Frank},
            booktitle={ICLR}, year={2019}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.AdamW(1e-3, weight_decay=0.1, mask=lambda p: p.ndim > 1)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # "w" (a matrix) is decayed, the bias "b" is not
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 0.0
    state_dtype: object = eqx.field(default=None, static=True)
    weight_decay: ScalarOrSchedule = 1e-4
    mask: FilterSpec | None = mask_field(default=None)
    nesterov: bool = eqx.field(default=False, static=True, kw_only=True)


_ARGS = r"""- `learning_rate`: $\eta$; a number, an array, or a schedule.
- `b1`, `b2`: decay rates $\beta_1, \beta_2$ of the moments, in `[0, 1)`.
- `eps`, `eps_root`: $\epsilon$ outside and $\epsilon_{\rm root}$ inside the root.
    Differentiating through updates (meta-gradients, `eqxopt.minimize`'s unrolled
    adjoint) needs `eps_root > 0` (e.g. `1e-8`) where a gradient entry can be exactly
    zero: the root's slope at 0 is infinite, and the derivative NaN (as Optax's).
- `state_dtype`: dtype of both moment buffers (Optax's `mu_dtype`); default the
    param's. (Static.)
"""
Adam.__init__.__doc__ = (
    "**Arguments:**\n\n"
    + _ARGS
    + ("- `nesterov`: use Nesterov momentum (NAdam-style). (Static, keyword-only.)\n")
)
AdamW.__init__.__doc__ = (
    "**Arguments:**\n\n"
    + _ARGS
    + (
        "- `weight_decay`: $\\lambda$, a number or a schedule; default `1e-4`.\n"
        "- `mask`: which leaves are decayed, as a filter spec; default all.\n"
        "- `nesterov`: use Nesterov momentum (NAdam-style). (Static, keyword-only.)\n"
    )
)
