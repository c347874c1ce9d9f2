"""D-Adaptation (AdamW variant): learning-rate-free AdamW."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer, scalar_hyperparams
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
    tree_map_unzip,
    tree_total,
    typechecked,
    write_after,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, plain_dtype, read, Stored, write


@typechecked
class DAdaptAdamWState(eqx.Module):
    """State of [`eqxopt.DAdaptAdamW`][]: the step count; the Adam moments `exp_avg`,
    `exp_avg_sq` and the EMA `grad_sum` of the step-weighted gradients (one leaf per
    param, possibly quantized: [`eqxopt.Quantized`][]); and two scalars, the distance
    estimate `estim_lr` and the weighted numerator of that estimate.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.DAdaptAdamW()
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        state.estim_lr  # the distance estimate d, grows from estim_lr0 = 1e-6
        ```
    """

    count: Int32[Array, ""]
    exp_avg: PyTree[Stored]
    exp_avg_sq: PyTree[Stored]
    grad_sum: PyTree[Stored]
    estim_lr: Float[Array, ""]
    numerator_weighted: Float[Array, ""]


class DAdaptAdamW(AbstractOptimizer[DAdaptAdamWState]):
    r"""D-Adaptation for AdamW: AdamW whose step size $d_k$ (an estimate of the
    distance to the solution) is learnt on the fly, so `learning_rate` is only a
    schedule multiplier around 1.

    With $\hat\eta_k = d_k\,\eta_k \sqrt{1-\beta_2^{k}} / (1-\beta_1^{k})$ ($k$ from
    1) and $\beta_3 = \sqrt{\beta_2}$,

    $$m_k = \beta_1 m_{k-1} + (1-\beta_1)\,\hat\eta_k\, g_k, \qquad
      v_k = \beta_2 v_{k-1} + (1-\beta_2)\,g_k^2$$

    $$r_k = \beta_3 r_{k-1} + (1-\beta_3)\,\hat\eta_k
      \left\langle g_k, \frac{s_{k-1}}{\sqrt{v_{k-1}} + \epsilon}\right\rangle,
      \qquad s_k = \beta_3 s_{k-1} + (1-\beta_3)\,\hat\eta_k\, g_k$$

    $$d_{k+1} = \max\left(d_k,\ \frac{r_k}{(1-\beta_3)\,\|s_k\|_1}\right), \qquad
      u_k = -\frac{m_k}{\sqrt{v_k} + \epsilon} - \lambda\,\hat\eta_k\, p_k$$

    Matches `optax.contrib.dadapt_adamw`, except that the estimate is left unchanged
    (not made NaN) while $\|s_k\|_1 = 0$, i.e. while all gradients seen are zero. The
    two scalars of the state are kept in at least float32 (Optax keeps them in the
    params' lowest precision). Needs `params` in `update`.

    ??? cite "References"

        ```bibtex
        @inproceedings{defazio2023dadaptation,
            title={Learning-Rate-Free Learning by {D}-Adaptation},
            author={Defazio, Aaron and Mishchenko, Konstantin},
            booktitle={ICML}, year={2023}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        schedule = eqxopt.schedules.Linear(1.0, 0.0, transition_steps=1000)
        opt = eqxopt.DAdaptAdamW(schedule, weight_decay=1e-2)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule = 1.0
    betas: tuple[ScalarLike, ScalarLike] = (0.9, 0.999)
    eps: ScalarLike = 1e-8
    estim_lr0: ScalarLike = 1e-6
    weight_decay: ScalarLike = 0.0
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)

    _state_buffers = {"exp_avg": False, "exp_avg_sq": True, "grad_sum": False}

    def __check_init__(self):
        if not isinstance(self.betas, tuple) or len(self.betas) != 2:
            raise ValueError(
                f"`DAdaptAdamW(betas=...)` must be a pair (b1, b2), got {self.betas!r}."
            )
        for i, b in enumerate(self.betas):
            if isinstance(b, bool) or not isinstance(b, (int, float)):
                continue  # an array or tracer: checked where it is used
            if not 0 <= b < 1:
                raise ValueError(
                    f"`DAdaptAdamW(betas=...)` must be in [0, 1), got betas[{i}]={b!r}."
                )
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "eps", "weight_decay"),
            positive=("estim_lr0",),
        )

    def init(self, params: Params) -> DAdaptAdamWState:
        dtype = scalar_state_dtype(params, plain_dtype(self.state_dtype))
        buffer = lambda name, nonnegative: buffers_like(
            params, self.state_dtype, name, nonnegative
        )
        return DAdaptAdamWState(
            zero_count(),
            buffer("exp_avg", False),
            buffer("exp_avg_sq", True),
            buffer("grad_sum", False),
            jnp.full((), self.estim_lr0, dtype),
            jnp.zeros((), dtype),
        )

    def update(self, grads: Updates, state: DAdaptAdamWState, params=None, **extra):
        need_params(self, params)
        dtype = state.estim_lr.dtype
        count = increment(state.count)
        t = count.astype(dtype)
        b1, b2 = (scalar(b, dtype) for b in self.betas)
        sb2 = b2**0.5
        lr = scalar(resolve(self.learning_rate, state.count), dtype)
        bc = jnp.sqrt(1 - b2**t) / (1 - b1**t)
        d = state.estim_lr
        dlr = d * lr * bc
        eps = scalar(self.eps, dtype)
        wd = scalar(self.weight_decay, dtype)

        def _leaf(g, ea, eas, s, p):
            ldt = compute_dtype(dtype, g.dtype, *map(dtype_of, (ea, eas, s)))
            b1_, b2_, sb2_ = b1.astype(ldt), b2.astype(ldt), sb2.astype(ldt)
            dlr_, eps_ = dlr.astype(ldt), eps.astype(ldt)
            g32, s32, eas32 = g.astype(ldt), read(s, ldt), read(eas, ldt)
            numerator = real_vdot(g32, s32 / (jnp.sqrt(eas32) + eps_))
            # The new buffers overwrite the donated ones in place only once the
            # reduction has read them: written after its result.
            new_ea = b1_ * read(ea, ldt) + (1 - b1_) * dlr_ * g32
            new_eas = write_after(b2_ * eas32 + (1 - b2_) * abs_sq(g32), numerator)
            new_s = write_after(sb2_ * s32 + (1 - sb2_) * dlr_ * g32, numerator)
            u = -wd.astype(ldt) * dlr_ * p.astype(ldt) - new_ea / (
                jnp.sqrt(new_eas) + eps_
            )
            return pack(
                u.astype(out_dtype(g, p)),
                write(new_ea, ea),
                write(new_eas, eas),
                write(new_s, s),
                numerator.astype(dtype),
                jnp.sum(jnp.abs(new_s)).astype(dtype),
            )

        updates, ea, eas, s, num, l1 = tree_map_unzip(
            _leaf,
            6,
            grads,
            state.exp_avg,
            state.exp_avg_sq,
            state.grad_sum,
            params,
            names=(
                "grads",
                "state.exp_avg",
                "state.exp_avg_sq",
                "state.grad_sum",
                "params",
            ),
        )
        numerator, grad_sum_l1 = tree_total(num, dtype), tree_total(l1, dtype)
        nw = sb2 * state.numerator_weighted + (1 - sb2) * dlr * numerator
        estimate = nw / ((1 - sb2) * grad_sum_l1)
        new_d = jnp.where(grad_sum_l1 > 0, jnp.maximum(d, estimate), d)
        return updates, DAdaptAdamWState(count, ea, eas, s, new_d, nw)

    _write_after_params = ("exp_avg_sq",)  # see `AbstractOptimizer.step`

    def hyperparams(self, state: DAdaptAdamWState) -> dict[str, Any]:
        hp = scalar_hyperparams(self, state.count)
        hp["b1"], hp["b2"] = self.betas
        return hp


DAdaptAdamW.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta_k$, a multiplier of the estimated step; a number or a
    schedule (e.g. linear decay from 1, with a warmup); default `1`.
- `betas`: the pair $(\beta_1, \beta_2)$ of Adam decay rates, each in `[0, 1)`.
- `eps`: $\epsilon$ in the denominators.
- `estim_lr0`: the initial (under-)estimate $d_0 > 0$.
- `weight_decay`: decoupled (AdamW-style) weight decay $\lambda$.
- `state_dtype`: dtype of the moments, the gradient EMA and the two scalars;
    default the params' (at least float32 for the scalars). An
    [`eqxopt.Quantized`][] quantizes the three buffers, a dict keyed by `"exp_avg"`,
    `"exp_avg_sq"` and `"grad_sum"` each; the scalars then keep their default.
    (Static, keyword-only; Optax's `dadapt_adamw` has no such option.)
"""
