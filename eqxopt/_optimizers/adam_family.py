"""Adam's relatives: Adamax, AMSGrad, NAdam, RAdam, AdaBelief, Yogi (with their
`ScaleBy*` building blocks). They share Adam's per-leaf helpers (`adam.py`)."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Inexact, Int32, PyTree

from .._base import AbstractOptimizer
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    abs_sq,
    check_hyperparams,
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
    zeros_like,
)
from .._transform.weight_decay import decay_mask
from .adam import (
    adam_family_step,
    adam_moments,
    AdamState,
    descent,
    full_like,
    per_dtype,
)


_NUMBERS = (
    "learning_rate",
    "eps",
    "eps_root",
    "weight_decay",
    "initial_accumulator_value",
)


def _check(opt):
    check_hyperparams(
        opt,
        nonnegative=tuple(n for n in _NUMBERS if hasattr(opt, n)),
        unit_interval=("b1", "b2"),
    )


def per_step(fn):
    """`fn(t)` for the 1-based step number `t`, computed once per update and dtype:
    [`adam_family_step`][] passes the same `t` array to every leaf of one dtype, so the
    scalars of a rule (cast hyperparameters, bias corrections) are traced once, not
    once per leaf. (The cache holds `t`, so its `id` stays unique while it lives.)"""
    cache = {}

    def get(t):
        if id(t) not in cache:
            cache[id(t)] = (t, fn(t))
        return cache[id(t)][1]

    return get


def _betas(b1, b2, t):
    r"""$\beta_1, 1-\beta_1, \beta_2, 1-\beta_2$ and the bias corrections
    $1-\beta_1^t, 1-\beta_2^t$, as scalars of `t`'s dtype."""
    d1, d2 = scalar(b1, t.dtype), scalar(b2, t.dtype)
    return d1, 1 - d1, d2, 1 - d2, 1 - d1**t, 1 - d2**t


def _zeros(opt, params) -> AdamState:
    return AdamState(
        zero_count(),
        zeros_like(params, opt.state_dtype),
        zeros_like(params, opt.state_dtype),
    )


def _lr(opt, state):
    return resolve(opt.learning_rate, state.count)


def _decayed_descent(opt, state, params):
    """(finish, mask) for an optimizer with `learning_rate`, `weight_decay`, `mask`."""
    if params is None:
        raise ValueError(f"`{type(opt).__name__}.update` needs `params`.")
    wd = resolve(opt.weight_decay, state.count)
    return descent(_lr(opt, state), wd), decay_mask(opt.mask, params)


# --- Adamax ---------------------------------------------------------------------


def adamax_moments(b1, b2, eps):
    constants = per_step(lambda t: (*_betas(b1, b2, t), scalar(eps, t.dtype)))

    def moments(g, m, v, t):
        d1, one_minus_d1, d2, _, correction1, _, eps_ = constants(t)
        m = one_minus_d1 * g + d1 * m
        v = jnp.maximum(jnp.abs(g) + eps_, d2 * v)
        return (m / correction1) / v, m, v

    return moments


class ScaleByAdamax(AbstractOptimizer[AdamState]):
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

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _zeros(self, params)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        moments = adamax_moments(self.b1, self.b2, self.eps)
        return adam_family_step(grads, state, params, moments)


class Adamax(AbstractOptimizer[AdamState]):
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

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _zeros(self, params)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        moments = adamax_moments(self.b1, self.b2, self.eps)
        return adam_family_step(
            grads, state, params, moments, descent(_lr(self, state))
        )


class AdamaxW(AbstractOptimizer[AdamState]):
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

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _zeros(self, params)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        finish, mask = _decayed_descent(self, state, params)
        moments = adamax_moments(self.b1, self.b2, self.eps)
        return adam_family_step(grads, state, params, moments, finish, mask)


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


def _amsgrad_init(opt, params) -> AMSGradState:
    zeros = lambda: zeros_like(params, opt.state_dtype)
    return AMSGradState(zero_count(), zeros(), zeros(), zeros())


def _amsgrad_step(opt, grads, state: AMSGradState, params, lr=None):
    count = increment(state.count)

    def _constants(dtype):
        betas = _betas(opt.b1, opt.b2, count.astype(dtype))
        eps, eps_root = scalar(opt.eps, dtype), scalar(opt.eps_root, dtype)
        return *betas, eps, eps_root, None if lr is None else -scalar(lr, dtype)

    constants = per_dtype(_constants)  # traced once per update, not once per leaf

    def _leaf(g, m, v, v_max, p):
        dtype = compute_dtype(g.dtype, m.dtype, v.dtype, v_max.dtype)
        d1, one_minus_d1, d2, one_minus_d2, c1, c2, eps, eps_root, neg_lr = constants(
            dtype
        )
        g32 = g.astype(dtype)
        m32 = one_minus_d1 * g32 + d1 * m.astype(dtype)
        v32 = one_minus_d2 * abs_sq(g32) + d2 * v.astype(dtype)
        m_hat = m32 / c1 if opt.bias_correction_mu else m32
        v_eff = v32 / c2 if opt.bias_correction_nu else v32
        v_max32 = jnp.maximum(v_max.astype(dtype), v_eff)
        update = m_hat / (jnp.sqrt(v_max32 + eps_root) + eps)
        if neg_lr is not None:
            update = update * neg_lr
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


class ScaleByAmsgrad(AbstractOptimizer[AMSGradState]):
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

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AMSGradState:
        return _amsgrad_init(self, params)

    def update(self, grads: Updates, state: AMSGradState, params=None, **extra):
        return _amsgrad_step(self, grads, state, params)


class AMSGrad(AbstractOptimizer[AMSGradState]):
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

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AMSGradState:
        return _amsgrad_init(self, params)

    def update(self, grads: Updates, state: AMSGradState, params=None, **extra):
        return _amsgrad_step(self, grads, state, params, _lr(self, state))


# --- NAdam ----------------------------------------------------------------------


class NAdam(AbstractOptimizer[AdamState]):
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

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _zeros(self, params)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        moments = adam_moments(self.b1, self.b2, self.eps, self.eps_root, True)
        return adam_family_step(
            grads, state, params, moments, descent(_lr(self, state))
        )


class NAdamW(AbstractOptimizer[AdamState]):
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

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _zeros(self, params)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        finish, mask = _decayed_descent(self, state, params)
        moments = adam_moments(self.b1, self.b2, self.eps, self.eps_root, True)
        return adam_family_step(grads, state, params, moments, finish, mask)


# --- RAdam ----------------------------------------------------------------------


def radam_moments(b1, b2, eps, eps_root, threshold, nesterov: bool):
    def _constants(t):
        d1, one_minus_d1, d2, one_minus_d2, c1, c2 = _betas(b1, b2, t)
        # The length of the approximated SMA, and the variance rectification term
        # (NaN-free also where it is not used).
        rho_inf = 2 / (1 - d2) - 1
        b2t = d2**t
        rho = rho_inf - 2 * t * b2t / (1 - b2t)
        rectify = rho >= scalar(threshold, t.dtype)
        r2 = (rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho)
        r = jnp.sqrt(jnp.where(rectify, r2, 1))
        c1_next = 1 - d1 ** (t + 1) if nesterov else None
        eps_, eps_root_ = scalar(eps, t.dtype), scalar(eps_root, t.dtype)
        return (
            d1,
            one_minus_d1,
            d2,
            one_minus_d2,
            c1,
            c2,
            c1_next,
            rectify,
            r,
            eps_,
            eps_root_,
        )

    constants = per_step(_constants)

    def moments(g, m, v, t):
        (
            d1,
            one_minus_d1,
            d2,
            one_minus_d2,
            c1,
            c2,
            c1_next,
            rectify,
            r,
            eps_,
            eps_root_,
        ) = constants(t)
        m = one_minus_d1 * g + d1 * m
        v = one_minus_d2 * abs_sq(g) + d2 * v
        if nesterov:
            m_hat = d1 * (m / c1_next) + one_minus_d1 * (g / c1)
        else:
            m_hat = m / c1
        v_hat = v / c2
        adaptive = r * m_hat / (jnp.sqrt(v_hat + eps_root_) + eps_)
        return jnp.where(rectify, adaptive, m_hat), m, v

    return moments


class ScaleByRadam(AbstractOptimizer[AdamState]):
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

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _zeros(self, params)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        moments = radam_moments(
            self.b1, self.b2, self.eps, self.eps_root, self.threshold, self.nesterov
        )
        return adam_family_step(grads, state, params, moments)


class RAdam(AbstractOptimizer[AdamState]):
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

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _zeros(self, params)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        moments = radam_moments(
            self.b1, self.b2, self.eps, self.eps_root, self.threshold, self.nesterov
        )
        return adam_family_step(
            grads, state, params, moments, descent(_lr(self, state))
        )


# --- AdaBelief ------------------------------------------------------------------


def belief_moments(b1, b2, eps, eps_root, nesterov: bool):
    def _constants(t):
        c1_next = 1 - scalar(b1, t.dtype) ** (t + 1) if nesterov else None
        eps_, eps_root_ = scalar(eps, t.dtype), scalar(eps_root, t.dtype)
        return *_betas(b1, b2, t), c1_next, eps_, eps_root_

    constants = per_step(_constants)

    def moments(g, m, s, t):
        d1, one_minus_d1, d2, one_minus_d2, c1, c2, c1_next, eps_, eps_root_ = (
            constants(t)
        )
        m = one_minus_d1 * g + d1 * m
        # Optax's (ema + eps_root), summed in another order: a trailing `+ eps_root`
        # makes XLA:CPU copy a donated `s` before updating it.
        s = (one_minus_d2 * abs_sq(g - m) + eps_root_) + d2 * s
        if nesterov:
            m_hat = d1 * (m / c1_next) + one_minus_d1 * (g / c1)
        else:
            m_hat = m / c1
        return m_hat / (jnp.sqrt(s / c2) + eps_), m, s

    return moments


class ScaleByBelief(AbstractOptimizer[AdamState]):
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

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _zeros(self, params)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        moments = belief_moments(
            self.b1, self.b2, self.eps, self.eps_root, self.nesterov
        )
        return adam_family_step(grads, state, params, moments)


class AdaBelief(AbstractOptimizer[AdamState]):
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

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _zeros(self, params)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        moments = belief_moments(
            self.b1, self.b2, self.eps, self.eps_root, self.nesterov
        )
        return adam_family_step(
            grads, state, params, moments, descent(_lr(self, state))
        )


# --- Yogi -----------------------------------------------------------------------


def yogi_moments(b1, b2, eps, eps_root):
    def _constants(t):
        return *_betas(b1, b2, t), scalar(eps, t.dtype), scalar(eps_root, t.dtype)

    constants = per_step(_constants)

    def moments(g, m, v, t):
        d1, one_minus_d1, _, one_minus_d2, c1, c2, eps_, eps_root_ = constants(t)
        m = one_minus_d1 * g + d1 * m
        g2 = abs_sq(g)
        v = v - one_minus_d2 * jnp.sign(v - g2) * g2
        direction = (m / c1) / (jnp.sqrt(v / c2 + eps_root_) + eps_)
        return direction, m, v

    return moments


def _yogi_init(opt, params, value) -> AdamState:
    return AdamState(
        zero_count(),
        full_like(params, value, opt.state_dtype),
        full_like(params, value, opt.state_dtype),
    )


class ScaleByYogi(AbstractOptimizer[AdamState]):
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

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _yogi_init(self, params, self.initial_accumulator_value)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        moments = yogi_moments(self.b1, self.b2, self.eps, self.eps_root)
        return adam_family_step(grads, state, params, moments)


class Yogi(AbstractOptimizer[AdamState]):
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

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _yogi_init(self, params, 1e-6)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        moments = yogi_moments(self.b1, self.b2, self.eps, 0.0)
        return adam_family_step(
            grads, state, params, moments, descent(_lr(self, state))
        )


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
