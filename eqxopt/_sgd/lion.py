"""Lion (and the `ScaleByLion` building block)."""

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._filter_spec import decay_mask
from .._kernels import descent
from .._misc import (
    compute_dtype,
    increment,
    mask_field,
    out_dtype,
    pack,
    per_dtype,
    resolve,
    scalar,
    tree_map_unzip,
    typechecked,
    write_after,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, read, Stored, write


@typechecked
class LionState(eqx.Module):
    """State of [`eqxopt.Lion`][] and [`eqxopt.ScaleByLion`][]: the step count and the
    momentum, one leaf per param.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Lion(1e-4, b2=0.99)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert jnp.allclose(state.mu["b"], 0.01 * grads["b"])  # the momentum
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Stored]


_MODES = ("hard", "smooth", "refined")


def _lion_step(
    opt, grads, state: LionState, params, finish, mask=None, sign=None, apply=False
):
    """Per leaf: the interpolation $c = (1-\\beta_1) g + \\beta_1 m$ and the new
    momentum $m = (1-\\beta_2) g + \\beta_2 m$, in one pass over `g` and `m`. With
    `apply`, returns the new params ($p + u$) instead of the updates $u$."""
    sign = jnp.sign if sign is None else sign

    def _constants(dtype):
        b1, b2 = scalar(opt.b1, dtype), scalar(opt.b2, dtype)
        return b1, 1 - b1, b2, 1 - b2

    constants = per_dtype(_constants)  # traced once per update, not once per leaf

    def _leaf(g, m, p, selected):
        dtype = compute_dtype(g.dtype, dtype_of(m))
        b1, one_minus_b1, b2, one_minus_b2 = constants(dtype)
        g32, m32 = g.astype(dtype), read(m, dtype)
        direction = sign(one_minus_b1 * g32 + b1 * m32)
        update = direction if finish is None else finish(direction, g, p, selected)
        update = update.astype(out_dtype(g, p))
        new_m = one_minus_b2 * g32 + b2 * m32
        if apply:
            update = p + update  # exactly `eqx.apply_updates`
            # The old momentum is read twice, for the new params and the new momentum:
            # written after the params, a donated momentum is updated in place.
            new_m = write_after(new_m, update.astype(dtype))
        return pack(update, write(new_m, m))

    updates, mu = tree_map_unzip(
        _leaf,
        2,
        grads,
        state.mu,
        params,
        mask,
        names=("grads", "state.mu", "params", "mask"),
    )
    return updates, LionState(increment(state.count), mu)


def _init(opt, params: Params) -> LionState:
    return LionState(zero_count(), buffers_like(params, opt.state_dtype, "mu", False))


class ScaleByLion(AbstractOptimizer[LionState]):
    r"""Lion's direction without the learning rate:
    $\operatorname{sign}\big((1-\beta_1) g_k + \beta_1 m_{k-1}\big)$, then
    $m_k = (1-\beta_2) g_k + \beta_2 m_{k-1}$.

    `mode="smooth"` replaces the sign by $\tanh(\beta_s\,\cdot)$ and `mode="refined"`
    by the identity on $(-1, 1)$, saturating to the sign outside. Matches
    `optax.scale_by_lion`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByLion(b1=0.9, b2=0.99), eqxopt.ScaleByLearningRate(1e-4)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.99
    state_dtype: object = eqx.field(default=None, static=True)
    mode: str = eqx.field(default="hard", static=True, kw_only=True)
    smooth_beta: ScalarLike = eqx.field(default=1.0, kw_only=True)

    _state_buffers = {"mu": False}

    def __check_init__(self):
        check_hyperparams(
            self,
            closed_unit_interval=("b1",),
            unit_interval=("b2",),
            choices={"mode": _MODES},
        )

    def init(self, params: Params) -> LionState:
        return _init(self, params)

    def update(self, grads: Updates, state: LionState, params=None, **extra):
        if self.mode == "smooth":
            sign = lambda x: jnp.tanh(scalar(self.smooth_beta, x.dtype) * x)
        elif self.mode == "refined":
            sign = lambda x: jnp.where(jnp.abs(x) < 1, x, jnp.sign(x))
        else:
            sign = jnp.sign
        return _lion_step(self, grads, state, params, None, sign=sign)


class Lion(AbstractOptimizer[LionState]):
    r"""Lion (EvoLved Sign Momentum): a sign update of an interpolated momentum, with
    decoupled weight decay.

    $$c_k = (1-\beta_1)\,g_k + \beta_1 m_{k-1}, \qquad
      u_k = -\eta_k \left(\operatorname{sign}(c_k) + \lambda\,p_k\right)$$

    $$m_k = (1-\beta_2)\,g_k + \beta_2 m_{k-1}$$

    Every update element has magnitude $\eta$ (before weight decay), so Lion wants a
    learning rate 3-10x smaller than Adam's and a weight decay 3-10x larger. The
    weight decay applies only to the leaves `mask` selects (a filter spec). Matches
    `optax.lion`. The old momentum is read twice (for the step and for the new
    momentum); `Lion.step` orders the two reads so that, in a jitted step with the
    state donated, XLA updates the momentum in place, where Optax's Lion (and
    `update` followed by `eqx.apply_updates`) first copies it on CPU.

    ??? cite "References"

        ```bibtex
        @inproceedings{chen2023symbolic,
            title={Symbolic Discovery of Optimization Algorithms},
            author={Chen, Xiangning and Liang, Chen and Huang, Da and Real, Esteban
                and Wang, Kaiyuan and Pham, Hieu and Dong, Xuanyi and Luong, Thang
                and Hsieh, Cho-Jui and Lu, Yifeng and Le, Quoc V.},
            booktitle={NeurIPS}, year={2023}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Lion(1e-4, weight_decay=1e-2, mask=lambda p: p.ndim > 1)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.99
    state_dtype: object = eqx.field(default=None, static=True)
    weight_decay: ScalarOrSchedule = 1e-3
    mask: FilterSpec | None = mask_field(default=None)

    _state_buffers = {"mu": False}

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "weight_decay"),
            closed_unit_interval=("b1",),
            unit_interval=("b2",),
        )

    def init(self, params: Params) -> LionState:
        return _init(self, params)

    def _step(self, grads, state: LionState, params, apply: bool):
        lr = resolve(self.learning_rate, state.count)
        wd = resolve(self.weight_decay, state.count)
        mask = None if params is None else decay_mask(self.mask, params)
        finish = descent(lr, wd)
        return _lion_step(self, grads, state, params, finish, mask, apply=apply)

    def update(self, grads: Updates, state: LionState, params=None, **extra):
        return self._step(grads, state, params, apply=False)

    def step(self, model: Params, grads: Updates, state: LionState, **extra):
        """`update`, then `eqx.apply_updates`, fused so that a donated momentum buffer
        is updated in place."""
        new_params, state = self._step(grads, state, model, apply=True)
        model = jtu.tree_map(
            lambda new, old: old if new is None else new,
            new_params,
            model,
            is_leaf=lambda x: x is None,
        )
        return model, state


Lion.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`.
- `b1`: interpolation weight $\beta_1$ of the momentum in the update, in `[0, 1]`.
- `b2`: decay rate $\beta_2$ of the momentum, in `[0, 1)`.
- `state_dtype`: dtype of the momentum (Optax's `mu_dtype`); default the param's.
    (Static.)
- `weight_decay`: $\lambda$ (multiplied by the learning rate); a number or a
    schedule; default `1e-3`. Needs `params` in `update` unless it is `0`.
- `mask`: which leaves are decayed, as a filter spec; default all.
"""
ScaleByLion.__init__.__doc__ = r"""**Arguments:**

- `b1`: interpolation weight $\beta_1$ of the momentum, in `[0, 1]`.
- `b2`: decay rate $\beta_2$ of the momentum, in `[0, 1)`.
- `state_dtype`: dtype of the momentum (Optax's `mu_dtype`); default the param's.
    (Static.)
- `mode`: `"hard"` (sign, default), `"smooth"` ($\tanh(\beta_s x)$) or `"refined"`.
    (Static, keyword-only.)
- `smooth_beta`: $\beta_s$ for `mode="smooth"`. (Keyword-only.)
"""
