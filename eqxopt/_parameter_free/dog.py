"""DoG and DoWG: parameter-free step sizes from the distance travelled over the
gradients seen."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Inexact, Int32, PyTree

from .._checks import check_hyperparams, concrete_scalar, need_params
from .._core.base import AbstractOptimizer
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._filter_spec import decay_mask
from .._kernels import add_decay
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    mask_field,
    out_dtype,
    pack,
    per_dtype,
    resolve,
    scalar,
    scalar_state_dtype,
    tree_map,
    tree_map_unzip,
    tree_sum_of_squares,
    tree_total,
    typechecked,
    zero_count,
)


_INIT_STEPS = ("distance", "learning_rate", "heuristic")


def _copy(params):
    # A copy, not the params' own buffers, so that (params, state) can be donated to a
    # jitted step.
    return tree_map(lambda p: jnp.array(p, copy=True), params)


def _decayed_grads_and_norms(opt, grads, params, init_params, dtype):
    """Per leaf, in the compute dtype: the (weight-decayed) gradient $g + \\lambda p$,
    and the squared norms of it and of $p_0 - p$, summed over the leaves."""
    weight_decay = 0.0 if opt.weight_decay is None else opt.weight_decay
    mask = decay_mask(opt.mask, params)

    def _leaf(g, p, p0, selected):
        ldt = compute_dtype(dtype, g.dtype, p.dtype, p0.dtype)
        g32 = add_decay(g.astype(ldt), p.astype(ldt), weight_decay, selected)
        dist = abs_sq(p0.astype(ldt) - p.astype(ldt))
        return pack(g32, jnp.sum(abs_sq(g32)).astype(dtype), jnp.sum(dist))

    decayed, g_sq, dist_sq = tree_map_unzip(
        _leaf,
        3,
        grads,
        params,
        init_params,
        mask,
        names=("grads", "params", "state.init_params", "mask"),
    )
    return decayed, tree_total(g_sq, dtype), tree_total(dist_sq, dtype)


def _scaled(decayed, grads, params, step, lr):
    """$u = -\\eta\\,(s\\,g)$ per leaf (Optax's order of products), in the params'
    dtypes."""
    neg_lr = per_dtype(lambda d: -scalar(lr, d))

    def _leaf(g32, g, p):
        return (neg_lr(g32.dtype) * (step.astype(g32.dtype) * g32)).astype(
            out_dtype(g, p)
        )

    return tree_map(_leaf, decayed, grads, params, names=("decayed", "grads", "params"))


def _check_decay(opt):
    check_hyperparams(opt, nonnegative=("learning_rate", "weight_decay", "eps"))


@typechecked
class DoGState(eqx.Module):
    """State of [`eqxopt.DoG`][]: the step count, the initial params `init_params` (one
    leaf per param), the largest distance `max_dist` from them so far and the running
    sum `sum_sq_norm_grads` of squared gradient norms.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.DoG()
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert jnp.allclose(state.sum_sq_norm_grads, 6 * 0.25 + 2)  # |g|^2
        ```
    """

    count: Int32[Array, ""]
    init_params: PyTree[Inexact[Array, "..."]]
    max_dist: Float[Array, ""]
    sum_sq_norm_grads: Float[Array, ""]


class DoG(AbstractOptimizer[DoGState]):
    r"""DoG (Distance over Gradients): parameter-free SGD, whose step size is the
    largest distance from the initial params so far over the root of the sum of
    squared gradient norms.

    $$\bar r_k = \max\big(\bar r_{k-1},\ \|p_k - p_0\|\big), \qquad
      G_k = G_{k-1} + \|g_k\|^2, \qquad
      u_k = -\eta_k\,\frac{\bar r_k}{\sqrt{G_k + \epsilon}}\, g_k$$

    (norms over the whole PyTree; $g_k$ includes $\lambda p_k$ when `weight_decay` is
    given, on the leaves `mask` selects). The initial distance $\bar r_0$ is chosen
    by `init_step = (tag, value)`: `"distance"` sets $\bar r_0$ = `value`;
    `"heuristic"` sets $\bar r_0$ = `value` $\cdot (1 + \|p_0\|)$ (so `init` must see
    the real params); `"learning_rate"` sets $\bar r_0 = 0$ and takes the first step
    with step size `value`. The global version of DoG ("layer-wise DoG" is
    `optax.scale_by_distance_over_gradients`). The two scalars of the state are kept
    in at least float32 (Optax keeps them in the params' lowest precision). Needs
    `params` in `update`. Matches `optax.contrib.dog`. The authors recommend
    averaging the iterates (e.g. with [`eqxopt.ParamsEMA`][]).

    ??? cite "References"

        ```bibtex
        @inproceedings{ivgi2023dog,
            title={{DoG} is {SGD}'s Best Friend: A Parameter-Free Dynamic Step Size
                Schedule},
            author={Ivgi, Maor and Hinder, Oliver and Carmon, Yair},
            booktitle={ICML}, year={2023}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.DoG(init_step=("heuristic", 1e-4), weight_decay=1e-4)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule = 1.0
    init_step: tuple[str, ScalarLike] = ("heuristic", 1e-6)
    eps: ScalarLike = 1e-8
    weight_decay: ScalarLike | None = None
    mask: FilterSpec | None = mask_field(default=None)

    def __check_init__(self):
        step = self.init_step
        if (
            not isinstance(step, tuple)
            or len(step) != 2
            or not isinstance(step[0], str)
            or step[0] not in _INIT_STEPS
        ):
            raise ValueError(
                "`DoG(init_step=...)` must be a pair (tag, value) with tag one of "
                f"{', '.join(map(repr, _INIT_STEPS))}, got {step!r}."
            )
        value = concrete_scalar(self, "init_step", step[1])
        if value is not None and not value >= 0:
            raise ValueError(
                f"`DoG(init_step=...)` must have a value >= 0, got {step[1]!r}."
            )
        _check_decay(self)

    def init(self, params: Params) -> DoGState:
        dtype = scalar_state_dtype(params)
        tag, value = self.init_step
        if tag == "distance":
            r0 = scalar(value, dtype)
        elif tag == "heuristic":
            norm = jnp.sqrt(tree_sum_of_squares(params)).astype(dtype)
            r0 = scalar(value, dtype) * (1 + norm)
        else:
            r0 = jnp.zeros((), dtype)
        return DoGState(zero_count(), _copy(params), r0, jnp.zeros((), dtype))

    def update(self, grads: Updates, state: DoGState, params=None, **extra):
        need_params(self, params, "the distance travelled from the initial params")
        dtype = state.max_dist.dtype
        decayed, g_sq, dist_sq = _decayed_grads_and_norms(
            self, grads, params, state.init_params, dtype
        )
        max_dist = jnp.maximum(state.max_dist, jnp.sqrt(dist_sq))
        sum_sq = state.sum_sq_norm_grads + g_sq
        step = max_dist / jnp.sqrt(sum_sq + scalar(self.eps, dtype))
        tag, value = self.init_step
        if tag == "learning_rate":
            step = jnp.where(state.count == 0, scalar(value, dtype), step)
        lr = resolve(self.learning_rate, state.count)
        updates = _scaled(decayed, grads, params, step, lr)
        return updates, DoGState(
            increment(state.count), state.init_params, max_dist, sum_sq
        )


DoG.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta_k$, a multiplier of the DoG step (default `1`); a number,
    an array or a schedule.
- `init_step`: `(tag, value)`, how the first step is sized: tag `"distance"`,
    `"learning_rate"` or `"heuristic"` (see above). The suggested heuristic value is
    `1e-6`, or `1e-4` for models with batch normalisation.
- `eps`: $\epsilon$, added to the sum of squared gradient norms.
- `weight_decay`: $\lambda$, an L2 penalty added to the gradients before DoG (none
    by default).
- `mask`: which leaves are decayed, as a filter spec; default all.
"""


@typechecked
class DoWGState(eqx.Module):
    """State of [`eqxopt.DoWG`][]: the step count, the initial params `init_params` (one
    leaf per param), the distance-weighted sum `weighted_sq_norm_grads` of squared
    gradient norms and the estimate `estim_sq_dist` of the squared distance to the
    solution.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.DoWG()
        state = opt.init(params)
        assert jnp.allclose(state.estim_sq_dist, 1e-4)  # eps, by default
        params, state = opt.step(params, grads, state)
        ```
    """

    count: Int32[Array, ""]
    init_params: PyTree[Inexact[Array, "..."]]
    weighted_sq_norm_grads: Float[Array, ""]
    estim_sq_dist: Float[Array, ""]


class DoWG(AbstractOptimizer[DoWGState]):
    r"""DoWG (Distance over Weighted Gradients): parameter-free SGD, as DoG with the
    squared gradient norms weighted by the squared distance estimate.

    $$\bar r_k^2 = \max\big(\bar r_{k-1}^2,\ \|p_k - p_0\|^2\big), \qquad
      v_k = v_{k-1} + \bar r_k^2\,\|g_k\|^2, \qquad
      u_k = -\eta_k\,\frac{\bar r_k^2}{\sqrt{v_k} + \epsilon}\, g_k$$

    (norms over the whole PyTree; $g_k$ includes $\lambda p_k$ when `weight_decay` is
    given, on the leaves `mask` selects), from $\bar r_0^2$ = `init_estim_sq_dist`
    (default $\epsilon$). The two scalars of the state are kept in at least float32
    (Optax keeps them in the params' lowest precision). Needs `params` in `update`.
    Matches `optax.contrib.dowg`.

    ??? cite "References"

        ```bibtex
        @inproceedings{khaled2023dowg,
            title={{DoWG} Unleashed: An Efficient Universal Parameter-Free
                Gradient Descent Method},
            author={Khaled, Ahmed and Mishchenko, Konstantin and Jin, Chi},
            booktitle={NeurIPS}, year={2023}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.DoWG(init_estim_sq_dist=1e-3)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule = 1.0
    init_estim_sq_dist: ScalarLike | None = None
    eps: ScalarLike = 1e-4
    weight_decay: ScalarLike | None = None
    mask: FilterSpec | None = mask_field(default=None)

    def __check_init__(self):
        check_hyperparams(self, positive=("init_estim_sq_dist",))
        _check_decay(self)

    def init(self, params: Params) -> DoWGState:
        dtype = scalar_state_dtype(params)
        r0 = self.eps if self.init_estim_sq_dist is None else self.init_estim_sq_dist
        return DoWGState(
            zero_count(), _copy(params), jnp.zeros((), dtype), scalar(r0, dtype)
        )

    def update(self, grads: Updates, state: DoWGState, params=None, **extra):
        need_params(self, params, "the distance travelled from the initial params")
        dtype = state.estim_sq_dist.dtype
        decayed, g_sq, dist_sq = _decayed_grads_and_norms(
            self, grads, params, state.init_params, dtype
        )
        estim_sq_dist = jnp.maximum(state.estim_sq_dist, dist_sq)
        weighted = estim_sq_dist * g_sq + state.weighted_sq_norm_grads
        step = estim_sq_dist / (jnp.sqrt(weighted) + scalar(self.eps, dtype))
        lr = resolve(self.learning_rate, state.count)
        updates = _scaled(decayed, grads, params, step, lr)
        return updates, DoWGState(
            increment(state.count), state.init_params, weighted, estim_sq_dist
        )


DoWG.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta_k$, a multiplier of the DoWG step (default `1`); a number,
    an array or a schedule.
- `init_estim_sq_dist`: $\bar r_0^2 > 0$, the initial guess of the squared distance
    to the solution; `None` means `eps`.
- `eps`: $\epsilon$, added to the denominator (and the default $\bar r_0^2$).
- `weight_decay`: $\lambda$, an L2 penalty added to the gradients before DoWG (none
    by default).
- `mask`: which leaves are decayed, as a filter spec; default all.
"""
