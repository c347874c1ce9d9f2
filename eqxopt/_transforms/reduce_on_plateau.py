"""ReduceOnPlateau: scale the updates down when a monitored value stops improving."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Float, Int32

from .._checks import check_hyperparams, need_extra
from .._core.base import AbstractOptimizer, scalar_hyperparams
from .._custom_types import Params, ScalarLike, Updates
from .._misc import (
    compute_dtype,
    increment,
    is_param,
    out_dtype,
    scalar,
    tree_map,
    typechecked,
    zero_count,
)


@typechecked
class ReduceOnPlateauState(eqx.Module):
    """State of [`eqxopt.ReduceOnPlateau`][]: the current `scale`, the best averaged
    value seen, the number of averaged values without improvement (`plateau_count`),
    the remaining cooldown, and the running average (`avg_value`) of the `count`
    values accumulated since the last check.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.ReduceOnPlateau(patience=2)
        state = opt.init(params)
        _, state = opt.update(grads, state, params, value=jnp.asarray(3.0))
        assert state.best_value == 3.0 and state.scale == 1.0
        ```
    """

    scale: Float[Array, ""]
    best_value: Float[Array, ""]
    plateau_count: Int32[Array, ""]
    cooldown_count: Int32[Array, ""]
    count: Int32[Array, ""]
    avg_value: Float[Array, ""]


def _float_dtypes(params):
    return [x.dtype for x in jtu.tree_leaves(params) if is_param(x)]


class ReduceOnPlateau(AbstractOptimizer[ReduceOnPlateauState]):
    r"""Multiply the updates by a `scale` that drops by `factor` whenever the value
    passed as `update(..., value=loss)` has not improved for `patience` checks.

    Values are averaged over `accumulation_size` calls; each average $\bar v$ is then
    compared with the best average so far, $v^\ast$. It is an improvement when

    $$\bar v < v^\ast - \mathrm{rtol}\,|v^\ast| - \mathrm{atol}.$$

    After `patience` averages without an improvement the scale becomes
    $\max(\mathrm{factor}\cdot s, \mathrm{min\_scale})$ and the next `cooldown`
    averages are ignored. The scale multiplies the incoming updates, so use it as the
    last element of a [`eqxopt.Chain`][]
    (`Chain(Adam(1e-3), ReduceOnPlateau(patience=5))`), or read it with
    `opt.hyperparams(state)["scale"]` to drive something else.

    **Difference from Optax.** `optax.contrib.reduce_on_plateau` (and PyTorch's
    `ReduceLROnPlateau` in `threshold_mode="rel"`) test
    $\bar v < (1-\mathrm{rtol})\,v^\ast - \mathrm{atol}$. For a negative best value
    that threshold lies *above* $v^\ast$, so a value slightly worse than the best
    counts as an improvement and the scale is never reduced on a plateau of negative
    losses (a log-likelihood, an ELBO). The test here measures the relative tolerance
    on $|v^\ast|$ (pytorch/pytorch#47513); for positive values the two agree exactly,
    so this matches Optax on positive losses step for step.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.Adam(1e-2), eqxopt.ReduceOnPlateau(factor=0.5, patience=1)
        )
        state = opt.init(params)
        for loss in [-3.0, -3.0]:  # no improvement on a negative loss
            params, state = opt.step(params, grads, state, value=jnp.asarray(loss))
        assert opt.hyperparams(state)[1]["scale"] == 0.5
        ```
    """

    factor: ScalarLike = 0.1
    patience: ScalarLike = 10
    rtol: ScalarLike = 1e-4
    atol: ScalarLike = 0.0
    cooldown: ScalarLike = 0
    accumulation_size: ScalarLike = 1
    min_scale: ScalarLike = 0.0

    def __check_init__(self):
        check_hyperparams(
            self,
            positive=("factor", "accumulation_size"),
            unit_interval=("factor",),
            nonnegative=("patience", "atol", "cooldown", "min_scale"),
            closed_unit_interval=("rtol",),
        )
        rtol, atol = self.rtol, self.atol
        if (
            isinstance(rtol, (int, float))
            and isinstance(atol, (int, float))
            and rtol == 0
            and atol == 0
        ):
            raise ValueError(
                "`ReduceOnPlateau(atol=...)` must be > 0 when `rtol=0` (at least one "
                "of `rtol` and `atol` must be positive), got atol=0."
            )

    def init(self, params: Params) -> ReduceOnPlateauState:
        dtypes = _float_dtypes(params)
        # The scalars are at least float32 (in bfloat16, `best * (1 - 1e-4)` would
        # round to `best`), and float64 when every param is.
        value_dtype = compute_dtype(*dtypes)
        scale_dtype = compute_dtype(*dtypes) if dtypes else jnp.float32
        return ReduceOnPlateauState(
            scale=jnp.ones((), scale_dtype),
            best_value=jnp.full((), jnp.inf, value_dtype),
            plateau_count=zero_count(),
            cooldown_count=zero_count(),
            count=zero_count(),
            avg_value=jnp.zeros((), value_dtype),
        )

    def update(self, grads: Updates, state: ReduceOnPlateauState, params=None, **extra):
        (value,) = need_extra(self, extra, "value")
        vdt = state.avg_value.dtype
        count = increment(state.count)
        avg = (
            state.count.astype(vdt) * state.avg_value + jnp.asarray(value).astype(vdt)
        ) / count.astype(vdt)
        check = count == jnp.asarray(self.accumulation_size).astype(jnp.int32)

        best = state.best_value
        rtol, atol = scalar(self.rtol, vdt), scalar(self.atol, vdt)
        # `best - rtol * |best|`, written so that it is exactly Optax's
        # `(1 - rtol) * best` for a positive best, and stays `inf` at the start.
        threshold = best * (1 - rtol * jnp.sign(best)) - atol
        improved = avg < threshold
        new_best = jnp.where(check & improved, avg, best)
        plateau = jnp.where(improved, 0, increment(state.plateau_count))
        patience = jnp.asarray(self.patience).astype(jnp.int32)
        in_cooldown = state.cooldown_count > 0
        reduce = (plateau == patience) & ~in_cooldown
        sdt = state.scale.dtype
        reduced = jnp.maximum(
            state.scale * scalar(self.factor, sdt), scalar(self.min_scale, sdt)
        )
        kept = jnp.maximum(state.scale, scalar(self.min_scale, sdt))
        scale = jnp.where(in_cooldown, state.scale, jnp.where(reduce, reduced, kept))
        plateau = jnp.where(in_cooldown | reduce, 0, plateau)
        cooldown_count = jnp.where(
            in_cooldown,
            state.cooldown_count - 1,
            jnp.where(reduce, jnp.asarray(self.cooldown).astype(jnp.int32), 0),
        )
        new_state = ReduceOnPlateauState(
            scale=jnp.where(check, scale, state.scale),
            best_value=new_best,
            plateau_count=jnp.where(check, plateau, state.plateau_count),
            cooldown_count=jnp.where(check, cooldown_count, state.cooldown_count),
            count=jnp.where(check, 0, count),
            avg_value=jnp.where(check, jnp.zeros((), vdt), avg),
        )

        def _leaf(g, p):
            dtype = compute_dtype(g.dtype, sdt)
            u = new_state.scale.astype(dtype) * g.astype(dtype)
            return u.astype(out_dtype(g, p))

        return tree_map(_leaf, grads, params), new_state

    def hyperparams(self, state: ReduceOnPlateauState) -> dict[str, Any]:
        """The scalar hyperparameters, and `"scale"`: the factor the next update is
        multiplied by (the learning-rate multiplier)."""
        hp = scalar_hyperparams(self, None)
        hp["scale"] = state.scale
        return hp


ReduceOnPlateau.__init__.__doc__ = r"""**Arguments:**

- `factor`: the scale is multiplied by this, in `(0, 1)`, at each reduction.
- `patience`: the number of averaged values without improvement after which the
    scale is reduced.
- `rtol`: relative tolerance (on $|v^\ast|$) for an improvement, in `[0, 1]`.
- `atol`: absolute tolerance for an improvement, `>= 0`. `rtol` and `atol` cannot
    both be `0`.
- `cooldown`: the number of averaged values ignored after a reduction.
- `accumulation_size`: the number of `value`s averaged before each comparison; `1`
    for a validation loss, more for noisy mini-batch losses.
- `min_scale`: the scale never goes below this.

`update` needs the extra argument `value=` (the monitored loss, a scalar).
"""
