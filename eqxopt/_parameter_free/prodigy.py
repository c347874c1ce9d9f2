"""Prodigy: learning-rate-free AdamW with an adaptive estimate of the distance to the
solution."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Float, Inexact, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer, scalar_hyperparams
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    is_param,
    lowest_dtype,
    out_dtype,
    pack,
    real_dtype,
    real_vdot,
    resolve,
    scalar,
    tree_map,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, plain_dtype, read, Stored, write


@typechecked
class ProdigyState(eqx.Module):
    """State of [`eqxopt.Prodigy`][]: the step count; the Adam moments `exp_avg`,
    `exp_avg_sq` and the weighted gradient sum `grad_sum` (one leaf per param,
    possibly quantized: [`eqxopt.Quantized`][]); the initial params `params0` (in
    the params' dtypes); and two scalars, the learning-rate (distance) estimate
    `estim_lr` and the weighted numerator of that estimate.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Prodigy(1.0)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        state.estim_lr  # the distance estimate d, grows from d0 = 1e-6
        state.params0["w"]  # the initial params
        ```
    """

    count: Int32[Array, ""]
    exp_avg: PyTree[Stored]
    exp_avg_sq: PyTree[Stored]
    grad_sum: PyTree[Stored]
    params0: PyTree[Inexact[Array, "..."]]
    estim_lr: Float[Array, ""]
    numerator_weighted: Float[Array, ""]


class Prodigy(AbstractOptimizer[ProdigyState]):
    r"""Prodigy: AdamW whose step size $d_k$ is estimated on the fly, so the
    `learning_rate` is only a schedule multiplier around 1.

    With $\hat\eta_k = d_k\,\eta_k \sqrt{1-\beta_2^{k}}/(1-\beta_1^{k})$ ($k$ from 1),

    $$m_k = \beta_1 m_{k-1} + (1-\beta_1)\,d_k g_k, \qquad
      v_k = \beta_2 v_{k-1} + (1-\beta_2)\,d_k^2 g_k^2$$

    $$s_k = \beta_3 s_{k-1} + \frac{d_k\,\hat\eta_k}{d_0}\,g_k, \qquad
      r_k = \beta_3 r_{k-1} + \frac{d_k\,\hat\eta_k}{d_0}\,\langle g_k, x_0 - x_k
      \rangle$$

    $$d_{k+1} = \max\left(d_k,\ c\,\frac{r_k}{\|s_k\|_1}\right), \qquad
      u_k = -\hat\eta_k \left(\frac{m_k}{\sqrt{v_k} + d_{k+1}\,\epsilon}
      + \lambda x_k\right)$$

    ($d_0$ = `estim_lr0`, $c$ = `estim_lr_coef`, $\beta_3$ defaults to
    $\sqrt{\beta_2}$; `safeguard_warmup` drops $\eta_k$ from the $s_k$ update.)
    Matches `optax.contrib.prodigy`, except that the estimate is left unchanged (not
    made NaN) while $\|s_k\|_1 = 0$, i.e. while all gradients seen are zero. The two
    scalars of the state have the lowest precision of the params' dtypes (as Optax),
    or `state_dtype` if given.

    ??? cite "References"

        ```bibtex
        @inproceedings{mishchenko2024prodigy,
            title={Prodigy: An Expeditiously Adaptive Parameter-Free Learner},
            author={Mishchenko, Konstantin and Defazio, Aaron},
            booktitle={ICML}, year={2024}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Prodigy(eqxopt.schedules.CosineDecay(1.0, decay_steps=1000))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule = 1.0
    betas: tuple[ScalarLike, ScalarLike] = (0.9, 0.999)
    beta3: ScalarLike | None = None
    eps: ScalarLike = 1e-8
    estim_lr0: ScalarLike = 1e-6
    estim_lr_coef: ScalarLike = 1.0
    weight_decay: ScalarLike = 0.0
    safeguard_warmup: bool = eqx.field(default=False, static=True)
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = {"exp_avg": False, "exp_avg_sq": True, "grad_sum": False}

    def __check_init__(self):
        if not isinstance(self.betas, tuple) or len(self.betas) != 2:
            raise ValueError(
                f"`Prodigy(betas=...)` must be a pair (b1, b2), got {self.betas!r}."
            )
        for i, b in enumerate(self.betas):
            if isinstance(b, (int, float)) and not 0 <= b < 1:
                raise ValueError(
                    f"`Prodigy(betas=...)` must be in [0, 1), got betas[{i}]={b!r}."
                )
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "eps", "estim_lr_coef", "weight_decay"),
            positive=("estim_lr0",),
            unit_interval=("beta3",),
        )

    def init(self, params: Params) -> ProdigyState:
        plain = plain_dtype(self.state_dtype)
        scalar_dtype = np.dtype(plain) if plain is not None else lowest_dtype(params)
        buffer = lambda name, nonnegative: buffers_like(
            params, self.state_dtype, name, nonnegative
        )
        return ProdigyState(
            zero_count(),
            buffer("exp_avg", False),
            buffer("exp_avg_sq", True),
            buffer("grad_sum", False),
            # A copy, not the params' own buffers, so that (params, state) can be
            # donated to a jitted step.
            tree_map(lambda p: jnp.array(p, copy=True), params),
            jnp.full((), self.estim_lr0, scalar_dtype),
            jnp.zeros((), scalar_dtype),
        )

    def update(self, grads: Updates, state: ProdigyState, params=None, **extra):
        need_params(self, params)
        leaves = [x for x in jtu.tree_leaves(grads) if is_param(x)]
        # The scalars are real, also for complex params.
        dtype = real_dtype(
            compute_dtype(state.estim_lr.dtype, *(x.dtype for x in leaves))
        )
        count = increment(state.count)
        t = count.astype(dtype)
        b1, b2 = (scalar(b, dtype) for b in self.betas)
        b3 = jnp.sqrt(b2) if self.beta3 is None else scalar(self.beta3, dtype)
        lr = scalar(resolve(self.learning_rate, state.count), dtype)
        d = state.estim_lr.astype(dtype)
        d0 = scalar(self.estim_lr0, dtype)
        bc = jnp.sqrt(1 - b2**t) / (1 - b1**t)
        # Optax rounds this to the scalar state's dtype.
        dlr = (d * lr * bc).astype(state.estim_lr.dtype).astype(dtype)
        sum_weight = d if self.safeguard_warmup else dlr

        def _moments(g, ea, eas, s, p0, p):
            ldt = compute_dtype(dtype, g.dtype, *map(dtype_of, (ea, eas, s)))
            g32 = g.astype(ldt)
            dg = d.astype(ldt) * g32
            ea32 = b1.astype(ldt) * read(ea, ldt) + (1 - b1.astype(ldt)) * dg
            eas32 = b2.astype(ldt) * read(eas, ldt) + (1 - b2.astype(ldt)) * abs_sq(dg)
            s32 = b3.astype(ldt) * read(s, ldt) + (
                sum_weight.astype(ldt) * dg / d0.astype(ldt)
            )
            diff = p0.astype(ldt) - p.astype(ldt)
            return pack(
                ea32,
                eas32,
                s32,
                real_vdot(g32, diff).astype(dtype),
                jnp.sum(jnp.abs(s32)).astype(dtype),
            )

        ea, eas, s, num, den = tree_map_unzip(
            _moments,
            5,
            grads,
            state.exp_avg,
            state.exp_avg_sq,
            state.grad_sum,
            state.params0,
            params,
            names=(
                "grads",
                "state.exp_avg",
                "state.exp_avg_sq",
                "state.grad_sum",
                "state.params0",
                "params",
            ),
        )
        zero = jnp.zeros((), dtype)
        numerator = sum((x for x in jtu.tree_leaves(num)), start=zero)
        denominator = sum((x for x in jtu.tree_leaves(den)), start=zero)
        nw = b3 * state.numerator_weighted.astype(dtype) + (d / d0) * dlr * numerator
        estimate = scalar(self.estim_lr_coef, dtype) * nw / denominator
        new_d = jnp.where(denominator > 0, jnp.maximum(d, estimate), d)
        new_d = new_d.astype(state.estim_lr.dtype)
        eps = scalar(self.eps, dtype)
        wd = scalar(self.weight_decay, dtype)

        def _update(g, ea32, eas32, p):
            ldt = ea32.dtype
            dlr_, wd_ = dlr.astype(ldt), wd.astype(ldt)
            denom = jnp.sqrt(eas32) + new_d.astype(ldt) * eps.astype(ldt)
            u = -wd_ * dlr_ * p.astype(ldt) - dlr_ * ea32 / denom
            return u.astype(out_dtype(g, p))

        updates = tree_map(
            _update, grads, ea, eas, params, names=("grads", "ea", "eas", "params")
        )

        return updates, ProdigyState(
            count,
            tree_map(write, ea, state.exp_avg),
            tree_map(write, eas, state.exp_avg_sq),
            tree_map(write, s, state.grad_sum),
            state.params0,
            new_d,
            nw.astype(state.numerator_weighted.dtype),
        )

    def hyperparams(self, state: ProdigyState) -> dict[str, Any]:
        hp = scalar_hyperparams(self, state.count)
        hp["b1"], hp["b2"] = self.betas
        return hp


Prodigy.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta_k$, a multiplier of the estimated step; a number or a
    schedule (e.g. cosine decay from 1 with warmup); default `1`.
- `betas`: the pair $(\beta_1, \beta_2)$ of Adam decay rates, each in `[0, 1)`.
- `beta3`: decay rate of the step-size estimate's sums; `None` means
    $\sqrt{\beta_2}$.
- `eps`: $\epsilon$ (scaled by the estimate) in the denominator.
- `estim_lr0`: the initial (under-)estimate $d_0 > 0$.
- `estim_lr_coef`: $c$, multiplies every estimate.
- `weight_decay`: decoupled (AdamW-style) weight decay $\lambda$.
- `safeguard_warmup`: leave $\eta_k$ out of the sum $s_k$, which avoids problems
    during a warmup. (Static.)
- `state_dtype`: dtype of the moments, the gradient sum and the two scalars; default
    the params' (the lowest precision among them for the scalars). An
    [`eqxopt.Quantized`][] quantizes the three buffers, a dict keyed by `"exp_avg"`,
    `"exp_avg_sq"` and `"grad_sum"` each; the scalars then keep their default.
    (Static.)
"""
