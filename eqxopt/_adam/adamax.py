"""Adamax and AdamaxW (Kingma & Ba 2015, section 7), and `ScaleByAdamax`."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array

from .._custom_types import FilterSpec, ScalarLike, ScalarOrSchedule
from .._kernels import (
    betas,
    ema,
)
from .._misc import (
    mask_field,
    scalar,
)
from .base import (
    AbstractAdamFamily,
    ARG_BETAS,
    ARG_EPS,
    ARG_LR,
    ARG_MASK,
    ARG_SD_KW,
    ARG_WD,
    init_doc,
    LeafRule,
)


class AbstractAdamax(AbstractAdamFamily):
    r"""Adamax's rule: $\hat m_k / v_k$ with $v_k = \max(|g_k| + \epsilon,
    \beta_2 v_{k-1})$, for [`eqxopt.ScaleByAdamax`][], [`eqxopt.Adamax`][] and
    [`eqxopt.AdamaxW`][]."""

    def _rule(self, t: Array) -> LeafRule:
        c = betas(self.b1, self.b2, t)
        eps = scalar(self.eps, t.dtype)

        def moments(g, m, v):
            m = ema(g, m, c.b1, c.one_minus_b1)
            v = jnp.maximum(jnp.abs(g) + eps, c.b2 * v)
            return (m / c.correction1) / v, m, v

        return moments


class ScaleByAdamax(AbstractAdamax):
    r"""Adamax's preconditioning, $\hat m_k / v_k$ with
    $v_k = \max(|g_k| + \epsilon, \beta_2 v_{k-1})$; the learning rate is left to a
    following [`eqxopt.ScaleByLearningRate`][]. Matches `optax.scale_by_adamax`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByAdamax(b1=0.9, b2=0.999), eqxopt.ScaleByLearningRate(2e-3)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)


class Adamax(AbstractAdamax):
    r"""Adamax: Adam with the infinity norm in place of the second moment.

    $$m_k = \beta_1 m_{k-1} + (1-\beta_1)\,g_k, \qquad
      v_k = \max(|g_k| + \epsilon,\ \beta_2 v_{k-1})$$

    $$u_k = -\eta_k\,\frac{m_k / (1-\beta_1^k)}{v_k}$$

    ($v$ needs no bias correction). Matches `optax.adamax` (which puts $\epsilon$
    inside the max; the paper has none).

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
        opt = eqxopt.Adamax(2e-3)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)


class AdamaxW(AbstractAdamax):
    r"""Adamax with decoupled weight decay:
    $u_k = -\eta_k\,\big(\hat m_k / v_k + \lambda\,p_k\big)$, with $\hat m, v$ as in
    [`eqxopt.Adamax`][] and the decay on the leaves `mask` selects (a filter spec).
    Matches `optax.adamaxw`.

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
        opt = eqxopt.AdamaxW(2e-3, weight_decay=0.01, mask=lambda p: p.ndim > 1)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert isinstance(state, eqxopt.AdamState)  # mu and the infinity norm nu
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    weight_decay: ScalarOrSchedule = 1e-4
    mask: FilterSpec | None = mask_field(default=None)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)


Adamax.__init__.__doc__ = init_doc(ARG_LR, ARG_BETAS, ARG_EPS, ARG_SD_KW)


ScaleByAdamax.__init__.__doc__ = init_doc(ARG_BETAS, ARG_EPS, ARG_SD_KW)


AdamaxW.__init__.__doc__ = init_doc(
    ARG_LR, ARG_BETAS, ARG_EPS, ARG_WD, ARG_MASK, ARG_SD_KW
)
