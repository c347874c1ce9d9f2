"""COCOB: learning-rate-free training by continuous coin betting."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Inexact, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._filter_spec import decay_mask
from .._kernels import add_decay
from .._misc import (
    compute_dtype,
    full_like_leaf,
    increment,
    mask_field,
    out_dtype,
    pack,
    per_dtype,
    resolve,
    scalar,
    tree_map,
    tree_map_unzip,
    typechecked,
    zero_count,
    zeros_like,
)


@typechecked
class COCOBState(eqx.Module):
    """State of [`eqxopt.COCOB`][]: the step count (for a `learning_rate` schedule) and,
    one leaf per param, the initial params `init_particles`, the negated gradient sum
    `cumulative_gradients`, the running maximum `scale` of $|g|$, the sum
    `subgradients` of $|g|$ and the `reward` (the bettor's wealth).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.COCOB()
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert jnp.allclose(state.cumulative_gradients["b"], -grads["b"])
        assert jnp.allclose(state.scale["w"], 0.5)  # max(eps, |g|)
        ```
    """

    count: Int32[Array, ""]
    init_particles: PyTree[Inexact[Array, "..."]]
    cumulative_gradients: PyTree[Inexact[Array, "..."]]
    scale: PyTree[Inexact[Array, "..."]]
    subgradients: PyTree[Inexact[Array, "..."]]
    reward: PyTree[Inexact[Array, "..."]]


class COCOB(AbstractOptimizer[COCOBState]):
    r"""COCOB-Backprop: continuous coin betting, a learning-rate-free optimizer.

    With $c_k = \eta_k\,(g_k + \lambda p_k)$ (per coordinate; $\eta$ defaults to 1),

    $$L_k = \max(L_{k-1}, |c_k|), \quad G_k = G_{k-1} + |c_k|, \quad
      R_k = \max\big(R_{k-1} - c_k\,(p_k - p_0),\ 0\big), \quad
      \theta_k = \theta_{k-1} - c_k$$

    $$p_{k+1} = p_0 + \frac{\theta_k\,(L_k + R_k)}{L_k \max(G_k + L_k,\ \alpha L_k)}$$

    starting from $L_0 = \epsilon$, $G_0 = R_0 = \theta_0 = 0$; the update is
    $u_k = p_{k+1} - p_k$. Note that `learning_rate` *multiplies the gradients*
    (it is not a step size) and the weight decay applies to the leaves `mask`
    selects. Needs `params` in `update`. Matches `optax.contrib.cocob`.

    ??? cite "References"

        ```bibtex
        @inproceedings{orabona2017cocob,
            title={Training Deep Networks without Learning Rates Through Coin
                Betting},
            author={Orabona, Francesco and Tommasi, Tatiana},
            booktitle={NeurIPS}, year={2017}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.COCOB(alpha=100.0, weight_decay=1e-4)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule = 1.0
    alpha: ScalarLike = 100.0
    eps: ScalarLike = 1e-8
    weight_decay: ScalarLike = 0.0
    mask: FilterSpec | None = mask_field(default=None)

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "weight_decay"),
            positive=("alpha", "eps"),
        )

    def init(self, params: Params) -> COCOBState:
        zeros = zeros_like(params)
        return COCOBState(
            zero_count(),
            # A copy, not the params' own buffers, so that (params, state) can be
            # donated to a jitted step.
            tree_map(lambda p: jnp.array(p, copy=True), params),
            zeros,
            tree_map(lambda p: full_like_leaf(p, self.eps), params),
            zeros,
            zeros,
        )

    def update(self, grads: Updates, state: COCOBState, params=None, **extra):
        need_params(self, params, "the bet is placed around the initial params")
        lr = resolve(self.learning_rate, state.count)
        mask = decay_mask(self.mask, params)
        constants = per_dtype(lambda d: (scalar(lr, d), scalar(self.alpha, d)))

        def _leaf(g, p, p0, cum, scale, sub, reward, selected):
            dtype = compute_dtype(g.dtype, p.dtype, p0.dtype, cum.dtype, scale.dtype)
            lr_, alpha = constants(dtype)
            g32, p32, p0_32 = g.astype(dtype), p.astype(dtype), p0.astype(dtype)
            c = lr_ * add_decay(g32, p32, self.weight_decay, selected)
            # max with eps: in float16 the state's initial eps has rounded to 0.
            L = jnp.maximum(
                jnp.maximum(scale.astype(dtype), scalar(self.eps, dtype)), jnp.abs(c)
            )
            G = sub.astype(dtype) + jnp.abs(c)
            R = jnp.maximum(reward.astype(dtype) - c * (p32 - p0_32), 0)
            C = cum.astype(dtype) - c
            new_p = p0_32 + C / (L * jnp.maximum(G + L, alpha * L)) * (L + R)
            return pack(
                (-p32 + new_p).astype(out_dtype(g, p)),
                C.astype(cum.dtype),
                L.astype(scale.dtype),
                G.astype(sub.dtype),
                R.astype(reward.dtype),
            )

        updates, cum, scale, sub, reward = tree_map_unzip(
            _leaf,
            5,
            grads,
            params,
            state.init_particles,
            state.cumulative_gradients,
            state.scale,
            state.subgradients,
            state.reward,
            mask,
            names=(
                "grads",
                "params",
                "state.init_particles",
                "state.cumulative_gradients",
                "state.scale",
                "state.subgradients",
                "state.reward",
                "mask",
            ),
        )
        return updates, COCOBState(
            increment(state.count), state.init_particles, cum, scale, sub, reward
        )


COCOB.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$, a multiplier of the gradients (default `1`); a number, an
    array or a schedule.
- `alpha`: $\alpha > 0$, bounds the fraction of the wealth bet at each step.
- `eps`: $\epsilon > 0$, the initial gradient scale $L_0$ (avoids dividing by 0;
    also the least scale a step uses, which matters only where the state's dtype
    rounds $\epsilon$ to 0, as float16 does 1e-8).
- `weight_decay`: $\lambda$, an L2 penalty added to the gradients.
- `mask`: which leaves are decayed, as a filter spec; default all.
"""
