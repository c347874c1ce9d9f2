"""Mechanic: a learning-rate tuner that wraps any optimizer."""

from typing import Any, Generic

import equinox as eqx
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Float, Inexact, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import (
    AbstractOptimizer,
    check_optimizer,
    child_update,
    scalar_hyperparams,
)
from .._custom_types import Params, ScalarLike, State, Updates
from .._misc import (
    compute_dtype,
    increment,
    is_param,
    lowest_dtype,
    out_dtype,
    pack,
    real_dtype,
    real_vdot,
    scalar,
    sharded_like,
    tree_map,
    tree_map_unzip,
    tree_sum_of_squares,
    tree_total,
    typechecked,
    zero_count,
)


@typechecked
class MechanizeState(eqx.Module, Generic[State]):
    """State of [`eqxopt.Mechanize`][] (Optax's `MechanicState`): the base optimizer's
    state, the step count, the reference point `x0` (one leaf per param), and four
    vectors with one entry per $\\beta$: the rewards `r`, the gradient-product scales
    `m`, the second moments `v` and the scale factors `s`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Mechanize(eqxopt.Adam(1.0))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert state.s.shape == (6,)  # one scale per beta; the step is sum(s)
        state.base_optimizer_state.mu["w"]  # Adam's first moment
        ```
    """

    base_optimizer_state: State
    count: Int32[Array, ""]
    r: Float[Array, " num_betas"]
    m: Float[Array, " num_betas"]
    v: Float[Array, " num_betas"]
    s: Float[Array, " num_betas"]
    x0: PyTree[Inexact[Array, "..."]]


class Mechanize(AbstractOptimizer[MechanizeState]):
    r"""Mechanic: learns the scale $\sigma_k$ of the updates of `base_optimizer`, so
    the base optimizer can run with learning rate 1 (or a schedule peaking at 1).

    The params are $x_k = x_0 + \sigma_k \Delta_k$, with $\Delta_k$ the sum of the
    base optimizer's updates $\delta_k$. Each step, with $g_k$ the gradient plus the
    weight decay $\lambda\,\sigma_{k-1}\,\|g_k\|/(\|x_k\| + \epsilon)\, x_k$,

    $$h_k = \langle g_k, \Delta_{k-1}\rangle, \qquad
      m_k = \max(\beta\, m_{k-1}, |h_k| + \epsilon), \qquad
      v_k = \beta^2 v_{k-1} + h_k^2$$

    $$r_k = \beta\, r_{k-1} + \mathrm{clip}(h_k, -m_{k-1}, m_{k-1})\, s_{k-1},
      \qquad
      s_k = \frac{(s_{\rm init}/n)\, m_k + \max(r_k, 0)}{\sqrt{v_k} + \epsilon}$$

    for each of the $n$ = `num_betas` rates $\beta \in \{0.9, 0.99, \ldots\}$, and
    $\sigma_k = \sum s_k$; then $\Delta_k = \Delta_{k-1} + \delta_k$ and
    $x_{k+1} = x_0 + \sigma_k \Delta_k$. $x_0$ is taken from the params at the
    first `update` (not at `init`), and $\Delta_{k-1}$ is recomputed as
    $(x_k - x_0)/(\sigma_{k-1} + \epsilon)$ (the memory-efficient variant), so the
    state holds one copy of the params. Needs `params` in `update`; extra `update`
    arguments are passed on to `base_optimizer`. The vectors `r`, `m`, `v`, `s` have
    the params' lowest precision (as Optax's). Matches `optax.contrib.mechanize`.

    ??? cite "References"

        ```bibtex
        @inproceedings{cutkosky2023mechanic,
            title={Mechanic: A Learning Rate Tuner},
            author={Cutkosky, Ashok and Defazio, Aaron and Mehta, Harsh},
            booktitle={NeurIPS}, year={2023}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        schedule = eqxopt.schedules.WarmupCosineDecay(0.0, 1.0, 100, 1000)
        opt = eqxopt.Mechanize(eqxopt.Adam(schedule))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    base_optimizer: AbstractOptimizer
    weight_decay: ScalarLike = 1e-2
    eps: ScalarLike = 1e-8
    s_init: ScalarLike = 1e-6
    num_betas: int = eqx.field(default=6, static=True)

    def __check_init__(self):
        check_optimizer("Mechanize", "base_optimizer", self.base_optimizer)
        check_hyperparams(
            self,
            nonnegative=("weight_decay", "eps", "s_init"),
            positive_int=("num_betas",),
        )

    def init(self, params: Params) -> MechanizeState:
        dtype = lowest_dtype(params)
        zeros = jnp.zeros((self.num_betas,), dtype)
        return MechanizeState(
            self.base_optimizer.init(params),
            zero_count(),
            zeros,
            zeros,
            zeros,
            jnp.full((self.num_betas,), self.s_init, dtype),
            # A copy, not the params' own buffers, so that (params, state) can be
            # donated to a jitted step.
            tree_map(lambda p: jnp.array(p, copy=True), params),
        )

    def update(self, grads: Updates, state: MechanizeState, params=None, **extra):
        need_params(self, params, "Mechanic rescales the distance from x0")
        base_updates, base_state = child_update(
            self.base_optimizer,
            ".base_optimizer_state",
            grads,
            state.base_optimizer_state,
            params,
            **extra,
        )
        first = state.count == 0
        vdt = state.s.dtype
        leaves = [x for x in jtu.tree_leaves(grads) if is_param(x)]
        # The scalars are real, also for complex params.
        dtype = real_dtype(compute_dtype(vdt, *(x.dtype for x in leaves)))
        s_sum = jnp.sum(state.s).astype(dtype)
        eps = scalar(self.eps, dtype)
        grad_norm = jnp.sqrt(tree_sum_of_squares(grads)).astype(dtype)
        param_norm = jnp.sqrt(tree_sum_of_squares(params)).astype(dtype)
        # Optax's order of products: wd * s_sum * |g| / (|x| + eps), then times x.
        decay = (
            scalar(self.weight_decay, dtype) * s_sum * grad_norm / (param_norm + eps)
        )

        def _h(g, p, x0):
            ldt = compute_dtype(dtype, g.dtype, p.dtype, x0.dtype)
            p32 = sharded_like(p.astype(ldt), x0)  # split like `x0`: `shard_over`
            x0_32 = jnp.where(first, p32, x0.astype(ldt))
            g32 = g.astype(ldt) + decay.astype(ldt) * p32
            delta_prev = (x0_32 - p32) / (s_sum + eps).astype(ldt)
            return pack(delta_prev, x0_32, real_vdot(g32, delta_prev).astype(dtype))

        delta_prev, x0, h_parts = tree_map_unzip(
            _h,
            3,
            grads,
            params,
            state.x0,
            names=("grads", "params", "state.x0"),
        )
        h = tree_total(h_parts, dtype)
        betas = jnp.asarray(
            np.array([1.0 - 0.1**i for i in range(1, self.num_betas + 1)], vdt),
            dtype,
        )
        r, m, v, s_old = (x.astype(dtype) for x in (state.r, state.m, state.v, state.s))
        clipped_h = lax.clamp(-m, jnp.broadcast_to(h, m.shape), m)
        new_m = jnp.maximum(betas * m, jnp.abs(h) + eps)
        new_v = betas**2 * v + h**2
        new_r = betas * r + clipped_h * s_old
        s_init = scalar(self.s_init / self.num_betas, dtype)  # as Optax: divide first
        wealth = s_init * new_m + jnp.maximum(new_r, 0)
        new_s = wealth / (jnp.sqrt(new_v) + eps)
        # Rounded to the state's dtype before use, as Optax does.
        new_s = new_s.astype(vdt)
        sigma = jnp.sum(new_s).astype(dtype)

        def _update(bu, dp, x0_32, p):
            ldt = dp.dtype
            delta = dp - bu.astype(ldt)
            new_p = x0_32 - sigma.astype(ldt) * delta
            return pack((new_p - p.astype(ldt)).astype(out_dtype(bu, p)), x0_32)

        updates, x0 = tree_map_unzip(
            _update,
            2,
            base_updates,
            delta_prev,
            x0,
            params,
            names=("base updates", "delta", "x0", "params"),
        )
        x0 = tree_map(lambda new, old: new.astype(old.dtype), x0, state.x0)
        return updates, MechanizeState(
            base_state,
            increment(state.count),
            new_r.astype(vdt),
            new_m.astype(vdt),
            new_v.astype(vdt),
            new_s,
            x0,
        )

    def hyperparams(self, state: MechanizeState) -> dict[str, Any]:
        hp = scalar_hyperparams(self, None)
        hp["base_optimizer"] = self.base_optimizer.hyperparams(
            state.base_optimizer_state
        )
        return hp


Mechanize.__init__.__doc__ = r"""**Arguments:**

- `base_optimizer`: the optimizer whose updates are rescaled (give it learning rate
    1, or a schedule peaking at 1).
- `weight_decay`: $\lambda$, Mechanic's own weight decay (not the base optimizer's);
    the default `1e-2` rarely needs tuning.
- `eps`: $\epsilon$.
- `s_init`: $s_{\rm init}$, the initial scale factor.
- `num_betas`: $n \ge 1$, the number of decay rates $1 - 10^{-i}$, $i = 1..n$.
    (Static.)
"""
