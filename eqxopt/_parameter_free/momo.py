"""MoMo and MoMo-Adam: momentum methods with a Polyak-type step size from a lower
bound of the loss."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int32, PyTree

from .._checks import check_hyperparams, need_extra, need_params
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    out_dtype,
    pack,
    real_vdot,
    resolve,
    scalar,
    scalar_state_dtype,
    tree_map,
    tree_map_unzip,
    tree_total,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, plain_dtype, read, Stored, write


# Optax takes no step while the momentum's squared norm is at most this
# (`jnp.finfo(float).eps`, the float64 machine epsilon, whatever the dtype).
_TINY = float(np.finfo(np.float64).eps)


def _polyak_step(opt, barf, gamma, iprod, norm, lb, alpha, bc1=None):
    """MoMo's step size $\\tau$ and the new lower bound, from the running averages
    (all 0-d arrays of one dtype). `bc1` is MoMo-Adam's bias correction."""
    dtype = barf.dtype
    wd = scalar(opt.weight_decay, dtype)
    lower_bound = scalar(opt.lower_bound, dtype)
    one_plus = 1 + alpha * wd
    if opt.adapt_lower_bound:
        cap = one_plus * (barf - gamma) + iprod
        if bc1 is None:
            this_lb = jnp.where(
                cap < one_plus * lb, jnp.maximum(cap / (2 * one_plus), lower_bound), lb
            )
        else:
            this_lb = jnp.where(
                cap < one_plus * bc1 * lb,
                jnp.maximum(cap / (2 * bc1 * one_plus), lower_bound),
                lb,
            )
    else:
        this_lb = lb
    shifted = this_lb if bc1 is None else bc1 * this_lb
    t1 = jnp.maximum(one_plus * (barf - shifted - gamma) + iprod, 0) / norm
    t1 = jnp.where(norm <= _TINY, jnp.zeros((), dtype), t1)  # no step at zero momentum
    tau = jnp.minimum(alpha if bc1 is None else alpha / bc1, t1)
    if opt.adapt_lower_bound:
        new_lb = (barf + iprod - gamma) - tau * norm / 2
        if bc1 is not None:
            new_lb = new_lb / bc1
        new_lb = jnp.maximum(new_lb, lower_bound)
    else:
        new_lb = lb
    return tau, new_lb, alpha * wd / one_plus


def _value(opt, extra, dtype):
    (value,) = need_extra(opt, extra, "value")
    return jnp.asarray(value).astype(dtype)


def _check(opt, betas):
    check_hyperparams(
        opt,
        nonnegative=("learning_rate", "weight_decay")
        + (("eps",) if hasattr(opt, "eps") else ()),
        unit_interval=betas,
    )


@typechecked
class MomoState(eqx.Module):
    """State of [`eqxopt.Momo`][]: the step count, the gradient EMA `exp_avg` (one leaf
    per param, possibly quantized: [`eqxopt.Quantized`][]), and three scalars: the
    loss EMA `barf`, the EMA `gamma` of $\\langle g_k, p_k\\rangle$, and the loss
    lower bound `lb`.

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        loss = lambda p: jnp.sum(p["w"] ** 2) + jnp.sum((p["b"] - 1) ** 2)
        opt = eqxopt.Momo()
        state = opt.init(params)
        value, grads = jax.value_and_grad(loss)(params)
        params, state = opt.step(params, grads, state, value=value)
        assert jnp.allclose(state.barf, value)  # the first loss seen
        ```
    """

    count: Int32[Array, ""]
    exp_avg: PyTree[Stored]
    barf: Float[Array, ""]
    gamma: Float[Array, ""]
    lb: Float[Array, ""]


class Momo(AbstractOptimizer[MomoState]):
    r"""MoMo: SGD with momentum and a Polyak-type step size, capped by the learning
    rate, from a model of the loss built with the same momentum.

    Needs the loss at `params` as the extra `update` argument `value=` (e.g. from
    `jax.value_and_grad`). With $\beta_k = 0$ at the first step and $\beta$ after,

    $$\bar f_k = \beta_k \bar f_{k-1} + (1-\beta_k)\, f_k, \quad
      d_k = \beta_k d_{k-1} + (1-\beta_k)\, g_k, \quad
      \gamma_k = \beta_k \gamma_{k-1} + (1-\beta_k) \langle g_k, p_k\rangle$$

    $$\tau_k = \min\left(\alpha_k,\ \frac{\big((1+\alpha_k\lambda)(\bar f_k -
      f_* - \gamma_k) + \langle d_k, p_k\rangle\big)_+}{\|d_k\|^2}\right), \qquad
      u_k = -\frac{\alpha_k\lambda}{1 + \alpha_k\lambda}\, p_k - \tau_k\, d_k$$

    ($\alpha_k$ = `learning_rate`, $f_*$ = `lower_bound`, $\lambda$ =
    `weight_decay`; no step is taken while $\|d_k\|^2 \le 2.2\cdot 10^{-16}$).
    `adapt_lower_bound=True` estimates $f_*$ on the fly. The three scalars of the
    state are kept in at least float32 (Optax keeps them in the params' lowest
    precision). Needs `params` in `update`. Matches `optax.contrib.momo`.

    ??? cite "References"

        ```bibtex
        @inproceedings{schaipp2024momo,
            title={{MoMo}: Momentum Models for Adaptive Learning Rates},
            author={Schaipp, Fabian and Ohana, Ruben and Eickenberg, Michael and
                Defazio, Aaron and Gower, Robert M.},
            booktitle={ICML}, year={2024}}
        ```

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        loss = lambda p: jnp.sum(p["w"] ** 2) + jnp.sum((p["b"] - 1) ** 2)
        opt = eqxopt.Momo(learning_rate=1.0, lower_bound=0.0)
        state = opt.init(params)
        for _ in range(3):
            value, grads = jax.value_and_grad(loss)(params)
            params, state = opt.step(params, grads, state, value=value)
        assert loss(params) < 2.1  # from 9 at the start
        ```
    """

    learning_rate: ScalarOrSchedule = 1.0
    beta: ScalarLike = 0.9
    lower_bound: ScalarLike = 0.0
    weight_decay: ScalarLike = 0.0
    adapt_lower_bound: bool = eqx.field(default=False, static=True)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)

    _state_buffers = {"exp_avg": False}

    def __check_init__(self):
        _check(self, ("beta",))

    def init(self, params: Params) -> MomoState:
        dtype = scalar_state_dtype(params, plain_dtype(self.state_dtype))
        zero = jnp.zeros((), dtype)
        return MomoState(
            zero_count(),
            buffers_like(params, self.state_dtype, "exp_avg", False),
            zero,
            zero,
            jnp.full((), self.lower_bound, dtype),
        )

    def update(self, grads: Updates, state: MomoState, params=None, **extra):
        need_params(self, params)
        dtype = state.barf.dtype
        value = _value(self, extra, dtype)
        first = state.count == 0
        bt = jnp.where(first, jnp.zeros((), dtype), scalar(self.beta, dtype))
        barf = bt * state.barf + (1 - bt) * value

        def _moments(g, ea, p):
            ldt = compute_dtype(dtype, g.dtype, dtype_of(ea), p.dtype)
            g32, p32 = g.astype(ldt), p.astype(ldt)
            bt_ = bt.astype(ldt)
            ea32 = bt_ * read(ea, ldt) + (1 - bt_) * g32
            return pack(
                ea32,
                real_vdot(g32, p32).astype(dtype),
                jnp.sum(abs_sq(ea32)).astype(dtype),
                real_vdot(ea32, p32).astype(dtype),
            )

        ea, gp, norm, iprod = tree_map_unzip(
            _moments,
            4,
            grads,
            state.exp_avg,
            params,
            names=("grads", "state.exp_avg", "params"),
        )
        gamma = bt * state.gamma + (1 - bt) * tree_total(gp, dtype)
        norm, iprod = tree_total(norm, dtype), tree_total(iprod, dtype)
        alpha = scalar(resolve(self.learning_rate, state.count), dtype)
        tau, lb, shrink = _polyak_step(self, barf, gamma, iprod, norm, state.lb, alpha)

        def _update(ea32, g, p):
            ldt = ea32.dtype
            u = -shrink.astype(ldt) * p.astype(ldt) - tau.astype(ldt) * ea32
            return u.astype(out_dtype(g, p))

        updates = tree_map(_update, ea, grads, params, names=("ea", "grads", "params"))
        exp_avg = tree_map(write, ea, state.exp_avg)
        return updates, MomoState(increment(state.count), exp_avg, barf, gamma, lb)


Momo.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\alpha_k$, the largest step size (default `1`, chosen large);
    a number, an array or a schedule.
- `beta`: the momentum $\beta$ of all three averages, in `[0, 1)`.
- `lower_bound`: $f_*$, a lower bound of the loss (`0` suits most losses).
- `weight_decay`: $\lambda$.
- `adapt_lower_bound`: estimate the lower bound on the fly, starting from
    `lower_bound`. (Static.)
- `state_dtype`: dtype of the momentum and the three scalars; default the param's
    (at least float32 for the scalars). An [`eqxopt.Quantized`][] (or a dict
    `{"exp_avg": ...}`) quantizes the momentum; the scalars then keep their default.
    (Static, keyword-only; Optax's `momo` has no such option.)
"""


@typechecked
class MomoAdamState(eqx.Module):
    """State of [`eqxopt.MomoAdam`][]: the step count, Adam's moments `exp_avg` and
    `exp_avg_sq` (one leaf per param, possibly quantized: [`eqxopt.Quantized`][]),
    and three scalars: the loss EMA `barf`, the
    EMA `gamma` of $\\langle g_k, p_k\\rangle$, and the loss lower bound `lb`.

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        loss = lambda p: jnp.sum(p["w"] ** 2) + jnp.sum((p["b"] - 1) ** 2)
        opt = eqxopt.MomoAdam()
        state = opt.init(params)
        value, grads = jax.value_and_grad(loss)(params)
        params, state = opt.step(params, grads, state, value=value)
        state.exp_avg_sq["w"], state.lb
        ```
    """

    count: Int32[Array, ""]
    exp_avg: PyTree[Stored]
    exp_avg_sq: PyTree[Stored]
    barf: Float[Array, ""]
    gamma: Float[Array, ""]
    lb: Float[Array, ""]


class MomoAdam(AbstractOptimizer[MomoAdamState]):
    r"""MoMo-Adam: Adam(W) with MoMo's Polyak-type step size, measured in Adam's
    preconditioned norm.

    Needs the loss at `params` as the extra `update` argument `value=`. With Adam's
    moments $m_k, v_k$ (decay rates $\beta_1, \beta_2$), $D_k = \epsilon +
    \sqrt{v_k / (1-\beta_2^k)}$, $\rho_k = 1 - \beta_1^k$, and the EMAs (rate
    $\beta_1$) $\bar f_k$ of the loss and $\gamma_k$ of $\langle g_k, p_k\rangle$,

    $$\tau_k = \min\left(\frac{\alpha_k}{\rho_k},\ \frac{\big((1+\alpha_k\lambda)
      (\bar f_k - \rho_k f_* - \gamma_k) + \langle m_k, p_k\rangle\big)_+}
      {\langle m_k, m_k / D_k\rangle}\right), \qquad
      u_k = -\frac{\alpha_k\lambda}{1 + \alpha_k\lambda}\, p_k
      - \tau_k\, \frac{m_k}{D_k}$$

    ($\alpha_k$ = `learning_rate`, $f_*$ = `lower_bound`, $\lambda$ =
    `weight_decay`). `adapt_lower_bound=True` estimates $f_*$ on the fly. The three
    scalars of the state are kept in at least float32 (Optax keeps them in the
    params' lowest precision). Needs `params` in `update`. Matches
    `optax.contrib.momo_adam`.

    ??? cite "References"

        ```bibtex
        @inproceedings{schaipp2024momo,
            title={{MoMo}: Momentum Models for Adaptive Learning Rates},
            author={Schaipp, Fabian and Ohana, Ruben and Eickenberg, Michael and
                Defazio, Aaron and Gower, Robert M.},
            booktitle={ICML}, year={2024}}
        ```

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        loss = lambda p: jnp.sum(p["w"] ** 2) + jnp.sum((p["b"] - 1) ** 2)
        opt = eqxopt.MomoAdam(1e-2, weight_decay=1e-4, adapt_lower_bound=True)
        state = opt.init(params)
        value, grads = jax.value_and_grad(loss)(params)
        params, state = opt.step(params, grads, state, value=value)
        ```
    """

    learning_rate: ScalarOrSchedule = 1e-2
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    lower_bound: ScalarLike = 0.0
    weight_decay: ScalarLike = 0.0
    adapt_lower_bound: bool = eqx.field(default=False, static=True)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)

    _state_buffers = {"exp_avg": False, "exp_avg_sq": True}

    def __check_init__(self):
        _check(self, ("b1", "b2"))

    def init(self, params: Params) -> MomoAdamState:
        dtype = scalar_state_dtype(params, plain_dtype(self.state_dtype))
        zero = jnp.zeros((), dtype)
        return MomoAdamState(
            zero_count(),
            buffers_like(params, self.state_dtype, "exp_avg", False),
            buffers_like(params, self.state_dtype, "exp_avg_sq", True),
            zero,
            zero,
            jnp.full((), self.lower_bound, dtype),
        )

    def update(self, grads: Updates, state: MomoAdamState, params=None, **extra):
        need_params(self, params)
        dtype = state.barf.dtype
        value = _value(self, extra, dtype)
        count = increment(state.count)
        b1, b2 = scalar(self.b1, dtype), scalar(self.b2, dtype)
        bc1 = 1 - b1 ** count.astype(dtype)
        bc2 = 1 - b2 ** count.astype(dtype)
        eps = scalar(self.eps, dtype)
        barf = b1 * state.barf + (1 - b1) * value

        def _moments(g, ea, eas, p):
            ldt = compute_dtype(dtype, g.dtype, dtype_of(ea), dtype_of(eas), p.dtype)
            b1_, b2_ = b1.astype(ldt), b2.astype(ldt)
            g32, p32 = g.astype(ldt), p.astype(ldt)
            ea32 = b1_ * read(ea, ldt) + (1 - b1_) * g32
            eas32 = b2_ * read(eas, ldt) + (1 - b2_) * abs_sq(g32)
            precond = eps.astype(ldt) + jnp.sqrt(eas32 / bc2.astype(ldt))
            return pack(
                ea32,
                eas32,
                precond,
                real_vdot(ea32, ea32 / precond).astype(dtype),
                real_vdot(g32, p32).astype(dtype),
                real_vdot(ea32, p32).astype(dtype),
            )

        ea, eas, precond, norm, gp, iprod = tree_map_unzip(
            _moments,
            6,
            grads,
            state.exp_avg,
            state.exp_avg_sq,
            params,
            names=("grads", "state.exp_avg", "state.exp_avg_sq", "params"),
        )
        gamma = b1 * state.gamma + (1 - b1) * tree_total(gp, dtype)
        norm, iprod = tree_total(norm, dtype), tree_total(iprod, dtype)
        alpha = scalar(resolve(self.learning_rate, state.count), dtype)
        tau, lb, shrink = _polyak_step(
            self, barf, gamma, iprod, norm, state.lb, alpha, bc1
        )

        def _update(ea32, prec, g, p):
            ldt = ea32.dtype
            u = -shrink.astype(ldt) * p.astype(ldt) - tau.astype(ldt) * ea32 / prec
            return u.astype(out_dtype(g, p))

        updates = tree_map(
            _update,
            ea,
            precond,
            grads,
            params,
            names=("ea", "precond", "grads", "params"),
        )
        exp_avg = tree_map(write, ea, state.exp_avg)
        exp_avg_sq = tree_map(write, eas, state.exp_avg_sq)
        return updates, MomoAdamState(count, exp_avg, exp_avg_sq, barf, gamma, lb)


MomoAdam.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\alpha_k$, the largest step size (default `1e-2`); a number,
    an array or a schedule.
- `b1`, `b2`: Adam's decay rates $\beta_1$, $\beta_2$, in `[0, 1)`; $\beta_1$ also
    averages the loss and $\langle g, p\rangle$.
- `eps`: $\epsilon$, added to Adam's denominator.
- `lower_bound`: $f_*$, a lower bound of the loss (`0` suits most losses).
- `weight_decay`: $\lambda$ (AdamW-style).
- `adapt_lower_bound`: estimate the lower bound on the fly, starting from
    `lower_bound`. (Static.)
- `state_dtype`: dtype of both moments and the three scalars; default the param's
    (at least float32 for the scalars). An [`eqxopt.Quantized`][] quantizes the
    moments, a dict keyed by `"exp_avg"` and `"exp_avg_sq"` each; the scalars then
    keep their default. (Static, keyword-only; Optax's `momo_adam` has no such
    option.)
"""
