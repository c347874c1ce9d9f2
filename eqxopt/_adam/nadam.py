"""NAdam and NAdamW (Dozat 2016): Adam with a Nesterov look-ahead first moment."""

from typing import ClassVar

import equinox as eqx

from .._custom_types import FilterSpec, ScalarLike, ScalarOrSchedule
from .._misc import (
    mask_field,
)
from .base import (
    AbstractAdam,
    ARG_BETAS,
    ARG_EPS,
    ARG_EPS_ROOT,
    ARG_LR,
    ARG_MASK,
    ARG_SD_POS,
    ARG_WD,
    init_doc,
)


class NAdam(AbstractAdam):
    r"""NAdam: Adam with Nesterov momentum.

    $$\bar m_k = \frac{\beta_1 m_k}{1-\beta_1^{k+1}} + \frac{(1-\beta_1)\,g_k}
      {1-\beta_1^k}, \qquad
      u_k = -\eta_k\,\frac{\bar m_k}{\sqrt{\hat v_k + \epsilon_{\rm root}} + \epsilon}$$

    with $m, v, \hat v$ as in [`eqxopt.Adam`][]. This is `eqxopt.Adam(...,
    nesterov=True)`; matches `optax.nadam` (which, like other implementations, leaves
    out the extra factor $\beta_2$ of Dozat's Algorithm 2 and his momentum schedule).

    ??? cite "References"

        ```bibtex
        @inproceedings{dozat2016incorporating,
            title={Incorporating {N}esterov Momentum into {A}dam},
            author={Dozat, Timothy},
            booktitle={ICLR Workshop}, year={2016}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.NAdam(1e-3)
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
    nesterov: ClassVar[bool] = True


class NAdamW(AbstractAdam):
    r"""NAdam with decoupled weight decay: the update of [`eqxopt.NAdam`][] plus
    $-\eta_k \lambda\,p_k$ on the leaves `mask` selects. This is `eqxopt.AdamW(...,
    nesterov=True)`; matches `optax.nadamw`.

    ??? cite "References"

        ```bibtex
        @inproceedings{dozat2016incorporating,
            title={Incorporating {N}esterov Momentum into {A}dam},
            author={Dozat, Timothy},
            booktitle={ICLR Workshop}, year={2016}}

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
        opt = eqxopt.NAdamW(1e-3, weight_decay=0.01)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # the same as eqxopt.AdamW(1e-3, weight_decay=0.01, nesterov=True)
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
    nesterov: ClassVar[bool] = True


NAdam.__init__.__doc__ = init_doc(ARG_LR, ARG_BETAS, ARG_EPS, ARG_EPS_ROOT, ARG_SD_POS)


NAdamW.__init__.__doc__ = init_doc(
    ARG_LR, ARG_BETAS, ARG_EPS, ARG_EPS_ROOT, ARG_SD_POS, ARG_WD, ARG_MASK
)
