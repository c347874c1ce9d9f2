"""Yogi (Zaheer et al. 2018) and `ScaleByYogi`: an additive second-moment update."""

from typing import ClassVar, TYPE_CHECKING

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array

from .._custom_types import ScalarLike, ScalarOrSchedule
from .._kernels import (
    adaptive,
    betas,
    ema,
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


class AbstractYogi(AbstractAdamFamily):
    """Yogi's rule, for [`eqxopt.ScaleByYogi`][] and [`eqxopt.Yogi`][]; both moments
    start at `initial_accumulator_value`."""

    eps_root: AbstractVar[ScalarLike]
    initial_accumulator_value: AbstractVar[ScalarLike]

    def _rule(self, t: Array) -> LeafRule:
        c = betas(self.b1, self.b2, t)
        eps, eps_root = scalar(self.eps, t.dtype), optional(self.eps_root, t.dtype)

        def moments(g, m, v):
            m = ema(g, m, c.b1, c.one_minus_b1)
            g2 = abs_sq(g)
            v = v - c.one_minus_b2 * jnp.sign(v - g2) * g2
            return adaptive(m / c.correction1, v / c.correction2, eps, eps_root), m, v

        return moments


class ScaleByYogi(AbstractYogi):
    r"""Yogi's preconditioning without the learning rate (see [`eqxopt.Yogi`][]).
    Both moments start at `initial_accumulator_value`. Matches `optax.scale_by_yogi`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByYogi(b1=0.9, b2=0.999), eqxopt.ScaleByLearningRate(1e-2)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-3
    eps_root: ScalarLike = 0.0
    initial_accumulator_value: ScalarLike = 1e-6
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)


class Yogi(AbstractYogi):
    r"""Yogi: Adam whose second moment moves additively towards $g^2$, so the effective
    learning rate cannot grow abruptly.

    $$m_k = \beta_1 m_{k-1} + (1-\beta_1)\,g_k, \qquad
      v_k = v_{k-1} - (1-\beta_2)\,\operatorname{sign}(v_{k-1} - g_k^2)\,g_k^2$$

    $$u_k = -\eta_k\,\frac{m_k / (1-\beta_1^k)}{\sqrt{v_k / (1-\beta_2^k)} + \epsilon}$$

    Matches `optax.yogi`: both moments start at $10^{-6}$ (Optax's
    `initial_accumulator_value`; the paper starts $m$ at 0), and the bias corrections
    are Optax's. Use [`eqxopt.ScaleByYogi`][] to choose the initial value.

    ??? cite "References"

        ```bibtex
        @inproceedings{zaheer2018adaptive,
            title={Adaptive Methods for Nonconvex Optimization},
            author={Zaheer, Manzil and Reddi, Sashank and Sachan, Devendra and
                Kale, Satyen and Kumar, Sanjiv},
            booktitle={NeurIPS}, year={2018}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Yogi(1e-2)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-3
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)
    # Fixed, as in `optax.yogi` (`eqxopt.ScaleByYogi` has them as fields).
    eps_root: ClassVar[float] = 0.0
    initial_accumulator_value: ClassVar[float] = 1e-6


Yogi.__init__.__doc__ = init_doc(ARG_LR, ARG_BETAS, ARG_EPS, ARG_SD_KW)


ScaleByYogi.__init__.__doc__ = init_doc(
    ARG_BETAS,
    ARG_EPS,
    ARG_EPS_ROOT,
    "- `initial_accumulator_value`: the initial value of both moments (`>= 0`).",
    ARG_SD_KW,
)
