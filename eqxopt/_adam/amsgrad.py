"""AMSGrad (Reddi et al. 2018) and `ScaleByAmsgrad`: Adam with the running maximum
of the second moment, a third buffer, hence its own base `AbstractAMSGrad`."""

from typing import TYPE_CHECKING

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._kernels import (
    adaptive,
    betas,
    descent_of,
    ema,
    optional,
)
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    out_dtype,
    pack,
    per_dtype,
    scalar,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, read, Stored, write
from .base import (
    ARG_BETAS,
    ARG_BIAS,
    ARG_EPS,
    ARG_EPS_ROOT,
    ARG_LR,
    ARG_SD_POS,
    init_doc,
)


# Abstract fields: type checkers see a `ClassVar` (as equinox does for its
# `AbstractClassVar`), so that their model of a final class's `__init__` takes its
# fields, in Optax's order, from the final class alone, as equinox does at run time.
if TYPE_CHECKING:
    from typing import ClassVar as AbstractVar
else:
    from equinox import AbstractVar


@typechecked
class AMSGradState(eqx.Module):
    """State of [`eqxopt.AMSGrad`][] and [`eqxopt.ScaleByAmsgrad`][]: the step count,
    the two moments and the running maximum `nu_max` of the second, one leaf per
    param (each may be quantized: [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.AMSGrad(1e-3)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert jnp.all(state.nu_max["w"] >= state.nu["w"])  # the running maximum
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Stored]
    nu: PyTree[Stored]
    nu_max: PyTree[Stored]


class AbstractAMSGrad(AbstractOptimizer[AMSGradState]):
    r"""AMSGrad's step, for [`eqxopt.ScaleByAmsgrad`][] and [`eqxopt.AMSGrad`][]:
    $\hat m_k / (\sqrt{v^{\max}_k + \epsilon_{\rm root}} + \epsilon)$, times
    $-\eta_k$ where the final class has a `learning_rate`."""

    b1: AbstractVar[ScalarLike]
    b2: AbstractVar[ScalarLike]
    eps: AbstractVar[ScalarLike]
    eps_root: AbstractVar[ScalarLike]
    state_dtype: AbstractVar[object]
    bias_correction_mu: AbstractVar[bool]
    bias_correction_nu: AbstractVar[bool]

    _state_buffers = {"mu": False, "nu": True, "nu_max": True}

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("eps", "eps_root")
            + (("learning_rate",) if hasattr(self, "learning_rate") else ()),
            unit_interval=("b1", "b2"),
        )

    def init(self, params: Params) -> AMSGradState:
        zeros = lambda name, nonnegative: buffers_like(
            params, self.state_dtype, name, nonnegative
        )
        return AMSGradState(
            zero_count(), zeros("mu", False), zeros("nu", True), zeros("nu_max", True)
        )

    def update(self, grads: Updates, state: AMSGradState, params=None, **extra):
        finish, _ = descent_of(self, state.count, params)
        count = increment(state.count)

        def _constants(dtype):
            c = betas(self.b1, self.b2, count.astype(dtype))
            return c, scalar(self.eps, dtype), optional(self.eps_root, dtype)

        constants = per_dtype(_constants)  # traced once per update, not once per leaf

        def _leaf(g, m, v, v_max, p):
            dtype = compute_dtype(g.dtype, dtype_of(m), dtype_of(v), dtype_of(v_max))
            c, eps, eps_root = constants(dtype)
            g32 = g.astype(dtype)
            m32 = ema(g32, read(m, dtype), c.b1, c.one_minus_b1)
            v32 = ema(abs_sq(g32), read(v, dtype), c.b2, c.one_minus_b2)
            m_hat = m32 / c.correction1 if self.bias_correction_mu else m32
            v_eff = v32 / c.correction2 if self.bias_correction_nu else v32
            v_max32 = jnp.maximum(read(v_max, dtype), v_eff)
            update = adaptive(m_hat, v_max32, eps, eps_root)
            if finish is not None:
                update = finish(update, g, p, None)
            return pack(
                update.astype(out_dtype(g, p)),
                write(m32, m),
                write(v32, v),
                write(v_max32, v_max),
            )

        updates, mu, nu, nu_max = tree_map_unzip(
            _leaf,
            4,
            grads,
            state.mu,
            state.nu,
            state.nu_max,
            params,
            names=("grads", "state.mu", "state.nu", "state.nu_max", "params"),
        )
        return updates, AMSGradState(count, mu, nu, nu_max)


class ScaleByAmsgrad(AbstractAMSGrad):
    r"""AMSGrad's preconditioning without the learning rate:
    $\hat m_k / (\sqrt{\hat v^{\max}_k + \epsilon_{\rm root}} + \epsilon)$. Matches
    `optax.scale_by_amsgrad`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.ScaleByAmsgrad(), eqxopt.ScaleByLearningRate(1e-3))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 0.0
    state_dtype: object = eqx.field(default=None, static=True)
    bias_correction_mu: bool = eqx.field(default=True, static=True)
    bias_correction_nu: bool = eqx.field(default=True, static=True)


class AMSGrad(AbstractAMSGrad):
    r"""AMSGrad: Adam with a non-decreasing second moment, which restores convergence
    on the counterexamples of Reddi et al.

    $$m_k = \beta_1 m_{k-1} + (1-\beta_1)\,g_k, \qquad
      v_k = \beta_2 v_{k-1} + (1-\beta_2)\,g_k^2$$

    $$v^{\max}_k = \max(v^{\max}_{k-1}, \hat v_k), \qquad
      u_k = -\eta_k\,\frac{\hat m_k}
                          {\sqrt{v^{\max}_k + \epsilon_{\rm root}} + \epsilon}$$

    with $\hat m_k = m_k / (1-\beta_1^k)$ and $\hat v_k = v_k / (1-\beta_2^k)$ (each
    bias correction can be switched off; with both off this is the paper's rule).
    Matches `optax.amsgrad`.

    ??? cite "References"

        ```bibtex
        @inproceedings{reddi2018convergence,
            title={On the Convergence of Adam and Beyond},
            author={Reddi, Sashank J. and Kale, Satyen and Kumar, Sanjiv},
            booktitle={ICLR}, year={2018}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.AMSGrad(1e-3)
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
    bias_correction_mu: bool = eqx.field(default=True, static=True)
    bias_correction_nu: bool = eqx.field(default=True, static=True)


AMSGrad.__init__.__doc__ = init_doc(
    ARG_LR, ARG_BETAS, ARG_EPS, ARG_EPS_ROOT, ARG_SD_POS, ARG_BIAS
)


ScaleByAmsgrad.__init__.__doc__ = init_doc(
    ARG_BETAS, ARG_EPS, ARG_EPS_ROOT, ARG_SD_POS, ARG_BIAS
)
