"""Adam's relatives: Adamax, AMSGrad, NAdam, RAdam, AdaBelief, Yogi (with their
`ScaleBy*` building blocks). Each rule is an abstract subclass of `AbstractAdamFamily`
(`adam.py`) that gives the per-leaf rule; the final classes are their fields. AMSGrad
keeps a third buffer, so it has its own base, `AbstractAMSGrad`."""

from typing import ClassVar, TYPE_CHECKING

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Inexact, Int32, PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._kernels import (
    adaptive,
    betas,
    descent_of,
    ema,
    first_moment_hat,
    optional,
)
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    mask_field,
    out_dtype,
    pack,
    per_dtype,
    scalar,
    tree_map_unzip,
    typechecked,
    zero_count,
    zeros_like,
)
from .adam import AbstractAdam, AbstractAdamFamily, LeafRule


# Abstract fields: type checkers see a `ClassVar` (as equinox does for its
# `AbstractClassVar`), so that their model of a final class's `__init__` takes its
# fields, in Optax's order, from the final class alone, as equinox does at run time.
if TYPE_CHECKING:
    from typing import ClassVar as AbstractVar
else:
    from equinox import AbstractVar


# --- Adamax ---------------------------------------------------------------------


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


# --- AMSGrad --------------------------------------------------------------------


@typechecked
class AMSGradState(eqx.Module):
    """State of [`eqxopt.AMSGrad`][] and [`eqxopt.ScaleByAmsgrad`][]: the step count,
    the two moments and the running maximum `nu_max` of the second, one leaf per
    param.

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
    mu: PyTree[Inexact[Array, "..."]]
    nu: PyTree[Inexact[Array, "..."]]
    nu_max: PyTree[Inexact[Array, "..."]]


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

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("eps", "eps_root")
            + (("learning_rate",) if hasattr(self, "learning_rate") else ()),
            unit_interval=("b1", "b2"),
        )

    def init(self, params: Params) -> AMSGradState:
        zeros = lambda: zeros_like(params, self.state_dtype)
        return AMSGradState(zero_count(), zeros(), zeros(), zeros())

    def update(self, grads: Updates, state: AMSGradState, params=None, **extra):
        finish, _ = descent_of(self, state.count, params)
        count = increment(state.count)

        def _constants(dtype):
            c = betas(self.b1, self.b2, count.astype(dtype))
            return c, scalar(self.eps, dtype), optional(self.eps_root, dtype)

        constants = per_dtype(_constants)  # traced once per update, not once per leaf

        def _leaf(g, m, v, v_max, p):
            dtype = compute_dtype(g.dtype, m.dtype, v.dtype, v_max.dtype)
            c, eps, eps_root = constants(dtype)
            g32 = g.astype(dtype)
            m32 = ema(g32, m.astype(dtype), c.b1, c.one_minus_b1)
            v32 = ema(abs_sq(g32), v.astype(dtype), c.b2, c.one_minus_b2)
            m_hat = m32 / c.correction1 if self.bias_correction_mu else m32
            v_eff = v32 / c.correction2 if self.bias_correction_nu else v32
            v_max32 = jnp.maximum(v_max.astype(dtype), v_eff)
            update = adaptive(m_hat, v_max32, eps, eps_root)
            if finish is not None:
                update = finish(update, g, p, None)
            return pack(
                update.astype(out_dtype(g, p)),
                m32.astype(m.dtype),
                v32.astype(v.dtype),
                v_max32.astype(v_max.dtype),
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


# --- NAdam ----------------------------------------------------------------------


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


# --- RAdam ----------------------------------------------------------------------


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


# --- AdaBelief ------------------------------------------------------------------


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


# --- Yogi -----------------------------------------------------------------------


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


# --- argument docs --------------------------------------------------------------

_LR = r"- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`."
_BETAS = r"- `b1`, `b2`: decay rates $\beta_1, \beta_2$ of the moments, in `[0, 1)`."
_EPS = r"- `eps`: $\epsilon$, added to the denominator outside the root."
_EPS_ROOT = r"- `eps_root`: $\epsilon_{\rm root}$, added inside the root."
_SD = "- `state_dtype`: dtype of every moment buffer; default the param's. (Static"
_SD_POS = _SD + "; Optax's `mu_dtype`.)"
_SD_KW = _SD + ", keyword-only.)"
_WD = (
    r"- `weight_decay`: $\lambda$ (multiplied by the learning rate); a number or a "
    "schedule."
)
_MASK = "- `mask`: which leaves are decayed, as a filter spec; default all."
_NESTEROV = "- `nesterov`: use NAdam's look-ahead first moment. (Static, keyword-only.)"
_BIAS = (
    "- `bias_correction_mu`, `bias_correction_nu`: whether to bias-correct the first "
    "moment, and the second before the maximum. (Static.)"
)
_THRESHOLD = (
    r"- `threshold`: $\tau$, the smallest $\rho_k$ that turns rectification on."
)


def _doc(*lines: str) -> str:
    return "**Arguments:**\n\n" + "\n".join(lines) + "\n"


Adamax.__init__.__doc__ = _doc(_LR, _BETAS, _EPS, _SD_KW)
ScaleByAdamax.__init__.__doc__ = _doc(_BETAS, _EPS, _SD_KW)
AdamaxW.__init__.__doc__ = _doc(_LR, _BETAS, _EPS, _WD, _MASK, _SD_KW)
AMSGrad.__init__.__doc__ = _doc(_LR, _BETAS, _EPS, _EPS_ROOT, _SD_POS, _BIAS)
ScaleByAmsgrad.__init__.__doc__ = _doc(_BETAS, _EPS, _EPS_ROOT, _SD_POS, _BIAS)
NAdam.__init__.__doc__ = _doc(_LR, _BETAS, _EPS, _EPS_ROOT, _SD_POS)
NAdamW.__init__.__doc__ = _doc(_LR, _BETAS, _EPS, _EPS_ROOT, _SD_POS, _WD, _MASK)
RAdam.__init__.__doc__ = _doc(
    _LR, _BETAS, _EPS, _EPS_ROOT, _THRESHOLD, _NESTEROV, _SD_KW
)
ScaleByRadam.__init__.__doc__ = _doc(
    _BETAS, _EPS, _EPS_ROOT, _THRESHOLD, _NESTEROV, _SD_KW
)
AdaBelief.__init__.__doc__ = _doc(
    _LR,
    _BETAS,
    _EPS,
    r"- `eps_root`: $\epsilon_{\rm root}$, added to $s$ at every step.",
    _NESTEROV,
    _SD_KW,
)
ScaleByBelief.__init__.__doc__ = _doc(
    _BETAS,
    _EPS,
    r"- `eps_root`: $\epsilon_{\rm root}$, added to $s$ at every step.",
    _NESTEROV,
    _SD_KW,
)
Yogi.__init__.__doc__ = _doc(_LR, _BETAS, _EPS, _SD_KW)
ScaleByYogi.__init__.__doc__ = _doc(
    _BETAS,
    _EPS,
    _EPS_ROOT,
    "- `initial_accumulator_value`: the initial value of both moments (`>= 0`).",
    _SD_KW,
)
