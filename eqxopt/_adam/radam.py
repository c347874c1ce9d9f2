"""RAdam (Liu et al. 2020) and `ScaleByRadam`: Adam with a rectified variance."""

from typing import TYPE_CHECKING

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array

from .._custom_types import ScalarLike, ScalarOrSchedule
from .._kernels import (
    adaptive,
    betas,
    ema,
    first_moment_hat,
    optional,
)
from .._misc import (
    abs_sq,
    scalar,
)
from .base import (
    AbstractAdamFamily,
    ARG_BETAS,
    ARG_EPS,
    ARG_EPS_ROOT,
    ARG_LR,
    ARG_NESTEROV,
    ARG_SD_KW,
    ARG_THRESHOLD,
    init_doc,
    LeafRule,
)


# Abstract fields: type checkers see a `ClassVar` (as equinox does for its
# `AbstractClassVar`), so that their model of a final class's `__init__` takes its
# fields, in Optax's order, from the final class alone, as equinox does at run time.
if TYPE_CHECKING:
    from typing import ClassVar as AbstractVar
else:
    from equinox import AbstractVar


class AbstractRAdam(AbstractAdamFamily):
    """RAdam's rectified rule, for [`eqxopt.ScaleByRadam`][] and [`eqxopt.RAdam`][]."""

    eps_root: AbstractVar[ScalarLike]
    threshold: AbstractVar[ScalarLike]
    nesterov: AbstractVar[bool]

    def _rule(self, t: Array) -> LeafRule:
        c = betas(self.b1, self.b2, t, self.nesterov)
        # The length of the approximated SMA, and the variance rectification term
        # (NaN-free also where it is not used).
        rho_inf = 2 / c.one_minus_b2 - 1
        rho = rho_inf - 2 * t * c.b2**t / c.correction2
        rectify = rho >= scalar(self.threshold, t.dtype)
        r2 = (rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho)
        r = jnp.sqrt(jnp.where(rectify, r2, 1))
        eps, eps_root = scalar(self.eps, t.dtype), optional(self.eps_root, t.dtype)

        def moments(g, m, v):
            m = ema(g, m, c.b1, c.one_minus_b1)
            v = ema(abs_sq(g), v, c.b2, c.one_minus_b2)
            m_hat = first_moment_hat(m, g, c)
            rectified = adaptive(r * m_hat, v / c.correction2, eps, eps_root)
            return jnp.where(rectify, rectified, m_hat), m, v

        return moments


class ScaleByRadam(AbstractRAdam):
    r"""RAdam's rectified preconditioning without the learning rate (see
    [`eqxopt.RAdam`][]). Matches `optax.scale_by_radam`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByRadam(threshold=5.0), eqxopt.ScaleByLearningRate(1e-3)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 0.0
    threshold: ScalarLike = 5.0
    nesterov: bool = eqx.field(default=False, static=True, kw_only=True)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)


class RAdam(AbstractRAdam):
    r"""RAdam (Rectified Adam): Adam whose adaptive step is switched on only once the
    variance of the adaptive learning rate is tractable, and then rectified.

    $$\rho_\infty = \frac{2}{1-\beta_2} - 1, \qquad
      \rho_k = \rho_\infty - \frac{2k\beta_2^k}{1-\beta_2^k}, \qquad
      r_k = \sqrt{\frac{(\rho_k-4)(\rho_k-2)\rho_\infty}
                       {(\rho_\infty-4)(\rho_\infty-2)\rho_k}}$$

    $$u_k = -\eta_k \begin{cases}
      r_k\,\hat m_k / (\sqrt{\hat v_k + \epsilon_{\rm root}} + \epsilon)
        & \rho_k \ge \tau \\
      \hat m_k & \text{otherwise}\end{cases}$$

    with $\hat m, \hat v$ as in [`eqxopt.Adam`][] and $\tau$ = `threshold` (the paper
    uses 4; Optax's default is 5). Matches `optax.radam`.

    ??? cite "References"

        ```bibtex
        @inproceedings{liu2020variance,
            title={On the Variance of the Adaptive Learning Rate and Beyond},
            author={Liu, Liyuan and Jiang, Haoming and He, Pengcheng and Chen, Weizhu
                and Liu, Xiaodong and Gao, Jianfeng and Han, Jiawei},
            booktitle={ICLR}, year={2020}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.RAdam(1e-3)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 0.0
    threshold: ScalarLike = 5.0
    nesterov: bool = eqx.field(default=False, static=True, kw_only=True)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)


RAdam.__init__.__doc__ = init_doc(
    ARG_LR, ARG_BETAS, ARG_EPS, ARG_EPS_ROOT, ARG_THRESHOLD, ARG_NESTEROV, ARG_SD_KW
)


ScaleByRadam.__init__.__doc__ = init_doc(
    ARG_BETAS, ARG_EPS, ARG_EPS_ROOT, ARG_THRESHOLD, ARG_NESTEROV, ARG_SD_KW
)
