"""AdaBelief (Zhuang et al. 2020) and `ScaleByBelief`: the second moment tracks
the gradient's deviation from its mean."""

from typing import TYPE_CHECKING

import equinox as eqx
from jaxtyping import Array

from .._custom_types import ScalarLike, ScalarOrSchedule
from .._kernels import (
    adaptive,
    betas,
    ema,
    first_moment_hat,
)
from .._misc import (
    abs_sq,
    scalar,
)
from .base import (
    AbstractAdamFamily,
    ARG_BETAS,
    ARG_EPS,
    ARG_LR,
    ARG_NESTEROV,
    ARG_SD_KW,
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


class AbstractAdaBelief(AbstractAdamFamily):
    """AdaBelief's rule, for [`eqxopt.ScaleByBelief`][] and [`eqxopt.AdaBelief`][]."""

    eps_root: AbstractVar[ScalarLike]
    nesterov: AbstractVar[bool]

    def _rule(self, t: Array) -> LeafRule:
        c = betas(self.b1, self.b2, t, self.nesterov)
        eps, eps_root = scalar(self.eps, t.dtype), scalar(self.eps_root, t.dtype)

        def moments(g, m, s):
            m = ema(g, m, c.b1, c.one_minus_b1)
            # Optax's (ema + eps_root), summed in another order: a trailing `+ eps_root`
            # makes XLA:CPU copy a donated `s` before updating it.
            s = (c.one_minus_b2 * abs_sq(g - m) + eps_root) + c.b2 * s
            m_hat = first_moment_hat(m, g, c)
            return adaptive(m_hat, s / c.correction2, eps, None), m, s

        return moments


class ScaleByBelief(AbstractAdaBelief):
    r"""AdaBelief's preconditioning without the learning rate (see
    [`eqxopt.AdaBelief`][]). Matches `optax.scale_by_belief`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByBelief(b1=0.9, b2=0.999), eqxopt.ScaleByLearningRate(1e-3)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-16
    eps_root: ScalarLike = 1e-16
    nesterov: bool = eqx.field(default=False, static=True, kw_only=True)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)


class AdaBelief(AbstractAdaBelief):
    r"""AdaBelief: Adam with the second moment of the gradient's deviation from its
    running mean (the "belief") in place of the raw second moment.

    $$m_k = \beta_1 m_{k-1} + (1-\beta_1)\,g_k, \qquad
      s_k = \beta_2 s_{k-1} + (1-\beta_2)\,(g_k - m_k)^2 + \epsilon_{\rm root}$$

    $$u_k = -\eta_k\,\frac{m_k / (1-\beta_1^k)}{\sqrt{s_k / (1-\beta_2^k)} + \epsilon}$$

    `nesterov=True` uses NAdam's look-ahead first moment. The state's `nu` holds $s$.
    Matches `optax.adabelief` (defaults `eps=eps_root=1e-16`; the paper's are `1e-8`
    and `0`).

    ??? cite "References"

        ```bibtex
        @inproceedings{zhuang2020adabelief,
            title={AdaBelief Optimizer: Adapting Stepsizes by the Belief in Observed
                Gradients},
            author={Zhuang, Juntang and Tang, Tommy and Ding, Yifan and
                Tatikonda, Sekhar and Dvornek, Nicha and Papademetris, Xenophon and
                Duncan, James S.},
            booktitle={NeurIPS}, year={2020}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.AdaBelief(1e-3)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-16
    eps_root: ScalarLike = 1e-16
    nesterov: bool = eqx.field(default=False, static=True, kw_only=True)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)


AdaBelief.__init__.__doc__ = init_doc(
    ARG_LR,
    ARG_BETAS,
    ARG_EPS,
    r"- `eps_root`: $\epsilon_{\rm root}$, added to $s$ at every step.",
    ARG_NESTEROV,
    ARG_SD_KW,
)


ScaleByBelief.__init__.__doc__ = init_doc(
    ARG_BETAS,
    ARG_EPS,
    r"- `eps_root`: $\epsilon_{\rm root}$, added to $s$ at every step.",
    ARG_NESTEROV,
    ARG_SD_KW,
)
