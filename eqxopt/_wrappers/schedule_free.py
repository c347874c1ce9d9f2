"""Schedule-free learning (Defazio et al., 2024): the `ScheduleFree` wrapper and the
fused `ScheduleFreeSGD` and `ScheduleFreeAdamW`.

Three sequences: the params hold $y$ (where gradients are taken), the state holds $z$
(the base optimizer's iterate), and $x$ (the average, used for evaluation) is recovered
from the two by `eval_params`. Per leaf the update is computed in at least float32 and
returned in the param's dtype; $z$ keeps its own dtype (the param's, or `state_dtype`,
which may also quantize it: `eqxopt.Quantized`).
"""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Float, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer, child_update, scalar_hyperparams
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    is_none,
    is_param,
    pack,
    real_dtype,
    resolve,
    scalar,
    tree_map,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import (
    buffers_like,
    copy_like,
    dtype_of,
    read,
    Stored,
    write,
)


# --- states --------------------------------------------------------------------------


@typechecked
class ScheduleFreeState(eqx.Module):
    """State of [`eqxopt.ScheduleFree`][]: the step count, the running maximum of the
    learning rate and the sum of averaging weights (float32 scalars, float64 for
    float64 params), the $z$ sequence (one leaf per param, an
    [`eqxopt.QuantizedArray`][] with a quantized `state_dtype`), and the inner
    optimizer's state.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.ScheduleFree(eqxopt.Adam(1e-3, b1=0.0), 1e-3).init(params)
        state.z["w"], state.max_lr, state.weight_sum
        assert isinstance(state.inner_state, eqxopt.AdamState)
        ```
    """

    count: Int32[Array, ""]
    max_lr: Float[Array, ""]
    weight_sum: Float[Array, ""]
    z: PyTree[Stored]
    inner_state: Any


@typechecked
class ScheduleFreeSGDState(eqx.Module):
    """State of [`eqxopt.ScheduleFreeSGD`][]: the step count, the running maximum of
    the learning rate and the sum of averaging weights (float32 scalars, float64 for
    float64 params), and the $z$ sequence (one leaf per param, an
    [`eqxopt.QuantizedArray`][] with a quantized `state_dtype`).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.ScheduleFreeSGD(1.0)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        state.z["w"]  # the base sequence; params are the interpolation y
        assert state.weight_sum > 0
        ```
    """

    count: Int32[Array, ""]
    max_lr: Float[Array, ""]
    weight_sum: Float[Array, ""]
    z: PyTree[Stored]


@typechecked
class ScheduleFreeAdamWState(eqx.Module):
    """State of [`eqxopt.ScheduleFreeAdamW`][]: as [`eqxopt.ScheduleFreeSGDState`][],
    plus the second moment `nu` (one leaf per param; both may be quantized).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.ScheduleFreeAdamW(1e-3).init(params)
        state.count, state.max_lr, state.weight_sum  # scalars
        state.z["w"], state.nu["w"]  # the z sequence and the second moment
        ```
    """

    count: Int32[Array, ""]
    max_lr: Float[Array, ""]
    weight_sum: Float[Array, ""]
    z: PyTree[Stored]
    nu: PyTree[Stored]


# --- shared pieces -------------------------------------------------------------------


def _scalar_dtype(params):
    """The dtype of the scalar state (max lr, weight sum): float32, or float64 when a
    param is float64. Never lower than float32, so the weight sum keeps counting."""
    dtypes = [real_dtype(x.dtype) for x in jtu.tree_leaves(params) if is_param(x)]
    return compute_dtype(*dtypes)


def _init_scalars(params):
    dtype = _scalar_dtype(params)
    return zero_count(), jnp.zeros((), dtype), jnp.zeros((), dtype)


def _init_z(params, state_dtype):
    return copy_like(params, state_dtype, "z")


def _warmup(learning_rate, warmup_steps, count, dtype):
    """The reference's warm-up: the k-th update (k from 0) uses
    `lr * (k + 1) / warmup_steps` while `k < warmup_steps`, then `lr`."""
    lr = scalar(learning_rate, dtype)
    if warmup_steps is None:
        return lr
    k = count.astype(dtype)
    steps = scalar(warmup_steps, dtype)
    return jnp.where(k < steps, lr * ((k + 1) / steps), lr)


def _averaging_weight(state, lr, weight_lr_power):
    """Returns `(max_lr, weight_sum, c)`: the new running maximum of the learning
    rate, the new sum of weights $\\sum_i \\gamma_{\\max,i}^p$ and the averaging weight
    $c = \\gamma_{\\max}^p / \\sum_i \\gamma_{\\max,i}^p$ (0 while the sum is 0)."""
    dtype = state.max_lr.dtype
    max_lr = jnp.maximum(state.max_lr, scalar(lr, dtype))
    weight = max_lr ** scalar(weight_lr_power, dtype)
    weight_sum = state.weight_sum + weight
    zero = weight_sum == 0
    c = jnp.where(zero, jnp.zeros_like(weight), weight / jnp.where(zero, 1, weight_sum))
    return max_lr, weight_sum, c


def _y_step(u, z, y, c, b1):
    """One schedule-free step on a leaf, all in one compute dtype.

    With $z' = z + u$ (the base optimizer's step), $x' = (1 - c)\\,x + c\\,z'$ and
    $y' = \\beta_1 x' + (1 - \\beta_1) z'$, where $x$ is implicit in
    $y = \\beta_1 x + (1 - \\beta_1) z$. Returns `(y' - y, z')`, written (as the
    reference implementation does) without dividing by $\\beta_1$:
    $y' - y = c\\,(z - y) + (1 - \\beta_1 + \\beta_1 c)\\,u$, computed from the new $z'$
    as $c\\,(z' - y) + (1 - \\beta_1)(1 - c)\\,u$ (equal in exact arithmetic): the
    update then reads $z'$, not the old $z$, so in a jitted step with the state
    donated XLA writes $z'$ in place and then the params, instead of first copying
    both $z$ and the params (each output otherwise overwrites the other's input).
    """
    new_z = z + u
    update = c * (new_z - y) + (1 - b1) * (1 - c) * u
    return update, new_z


def _eval_params(b1, z_tree, params):
    """$x = (y - (1 - \\beta_1) z) / \\beta_1$ per leaf, in the param's dtype; every
    leaf that is not optimised is returned unchanged."""

    def _leaf(p, z):
        dtype = compute_dtype(p.dtype, dtype_of(z))
        y = p.astype(dtype)
        x = y + (1 - 1 / scalar(b1, dtype)) * (read(z, dtype) - y)
        return x.astype(p.dtype)

    xs = tree_map(_leaf, params, z_tree, names=("params", "state.z"))
    return jtu.tree_map(lambda x, p: p if x is None else x, xs, params, is_leaf=is_none)


def _check_b1(opt):
    # b1 = 0 would make y = z, and x could not be recovered from them.
    check_hyperparams(opt, positive=("b1",), closed_unit_interval=("b1",))


# --- the wrapper ---------------------------------------------------------------------


class ScheduleFree(AbstractOptimizer[ScheduleFreeState]):
    r"""Schedule-free learning around any optimizer: its momentum is replaced by
    interpolation and averaging, and no decaying learning-rate schedule is needed.

    $$y_k = (1-\beta_1)\,z_k + \beta_1\,x_k, \qquad z_{k+1} = z_k + u_k,$$

    $$x_{k+1} = (1-c_{k+1})\,x_k + c_{k+1}\,z_{k+1}, \qquad
      c_{k+1} = \frac{\gamma_{\max,k}^{\,p}}{\sum_{i=0}^{k}\gamma_{\max,i}^{\,p}},\quad
      \gamma_{\max,k} = \max_{i \le k}\gamma_i,$$

    where $u_k$ is the inner optimizer's update for the gradient taken at $y_k$,
    $\gamma_k$ is `learning_rate` and $p$ is `weight_lr_power`. The params hold $y$; the
    state holds $z$; [`eqxopt.ScheduleFree.eval_params`][] returns $x$, the point to
    evaluate and checkpoint. Switch off the inner optimizer's momentum (e.g.
    `Adam(lr, b1=0.0)`).

    Matches `optax.contrib.schedule_free`, except that a scheduled `learning_rate` is
    evaluated at the number of updates already applied (as every eqxopt schedule, and as
    the inner optimizer evaluates its own), where Optax evaluates it one step ahead.
    The running maximum and the weight sum are float32 (float64 for float64 params)
    whatever the params' dtype: in bfloat16 the weight sum would stop growing after a
    few hundred steps.

    ??? cite "References"

        ```bibtex
        @inproceedings{defazio2024road,
            title={The Road Less Scheduled},
            author={Defazio, Aaron and Yang, Xingyu and Mehta, Harsh and
                    Mishchenko, Konstantin and Khaled, Ahmed and Cutkosky, Ashok},
            booktitle={NeurIPS}, year={2024}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.ScheduleFree(eqxopt.Adam(1e-3, b1=0.0), learning_rate=1e-3)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        eval_params = opt.eval_params(state, params)
        ```
    """

    optimizer: AbstractOptimizer
    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    weight_lr_power: ScalarLike = 2.0
    state_dtype: object = eqx.field(default=None, static=True)

    def __check_init__(self):
        if not isinstance(self.optimizer, AbstractOptimizer):
            raise ValueError(
                "`ScheduleFree(optimizer=...)` must be an eqxopt optimizer, got "
                f"{type(self.optimizer).__name__}. Wrap Optax transforms with "
                "`eqxopt.from_optax`."
            )
        check_hyperparams(self, nonnegative=("learning_rate", "weight_lr_power"))
        _check_b1(self)

    _state_buffers = {"z": False}

    def init(self, params: Params) -> ScheduleFreeState:
        count, max_lr, weight_sum = _init_scalars(params)
        return ScheduleFreeState(
            count,
            max_lr,
            weight_sum,
            _init_z(params, self.state_dtype),
            self.optimizer.init(params),
        )

    def update(
        self,
        grads: Updates,
        state: ScheduleFreeState,
        params: Params | None = None,
        **extra,
    ) -> tuple[Updates, ScheduleFreeState]:
        need_params(self, params, "the current point $y$")
        lr = resolve(self.learning_rate, state.count)
        max_lr, weight_sum, c = _averaging_weight(state, lr, self.weight_lr_power)
        inner_updates, inner_state = child_update(
            self.optimizer, ".inner_state", grads, state.inner_state, params, **extra
        )

        def _leaf(u, z, y):
            dtype = compute_dtype(u.dtype, dtype_of(z), y.dtype)
            update, new_z = _y_step(
                u.astype(dtype),
                read(z, dtype),
                y.astype(dtype),
                c.astype(dtype),
                scalar(self.b1, dtype),
            )
            return pack(update.astype(y.dtype), write(new_z, z))

        updates, z = tree_map_unzip(
            _leaf,
            2,
            inner_updates,
            state.z,
            params,
            names=("the inner optimizer's updates", "state.z", "params"),
        )
        new_state = ScheduleFreeState(
            increment(state.count), max_lr, weight_sum, z, inner_state
        )
        return updates, new_state

    def eval_params(self, state: ScheduleFreeState, params: Params) -> Params:
        r"""The averaged point $x = (y - (1-\beta_1)\,z)/\beta_1$, to evaluate or
        checkpoint, in the params' dtype (leaves that are not optimised are returned
        unchanged). Matches `optax.contrib.schedule_free_eval_params`."""
        return _eval_params(self.b1, state.z, params)

    def hyperparams(self, state: ScheduleFreeState) -> dict[str, Any]:
        out = scalar_hyperparams(self, state.count)
        out["optimizer"] = self.optimizer.hyperparams(state.inner_state)
        return out


ScheduleFree.__init__.__doc__ = r"""**Arguments:**

- `optimizer`: the base optimizer, an eqxopt optimizer without momentum; its update
    $u_k$ (learning rate included) is the step of $z$.
- `learning_rate`: $\gamma_k$, used only for the averaging weights; pass the base
    optimizer's learning rate (a number, an array, or the same schedule).
- `b1`: the interpolation $\beta_1$ between $x$ and $z$, in `(0, 1]`.
- `weight_lr_power`: $p$; the averaging weights are $\gamma_{\max}^p$ (0 for uniform
    averaging).
- `state_dtype`: dtype of $z$; default the param's. An [`eqxopt.Quantized`][] (or a
    dict `{"z": ...}`) quantizes $z$, initially the params. (Static.)
"""


# --- fused SGD and AdamW -------------------------------------------------------------


class ScheduleFreeSGD(AbstractOptimizer[ScheduleFreeSGDState]):
    r"""Schedule-free SGD, fused (as the reference implementation).

    $$\gamma_k = \gamma\,\min\!\left(1, \tfrac{k+1}{T_{\rm warmup}}\right), \qquad
      z_{k+1} = z_k - \gamma_k\,(g_k + \lambda\,y_k),$$

    with $y$, $x$ and the averaging weights as in [`eqxopt.ScheduleFree`][] (the
    warmed-up $\gamma_k$ is used in both places). The params hold $y$;
    [`eqxopt.ScheduleFreeSGD.eval_params`][] returns $x$.

    Without warm-up this matches `optax.contrib.schedule_free_sgd`. With warm-up it
    follows the reference (Defazio et al.'s `SGDScheduleFree`): the k-th update (k from
    0) steps $z$ with `lr * (k + 1) / warmup_steps`, where Optax uses `lr * k /
    warmup_steps` for the $z$ step (so Optax's first step is exactly zero) and
    `lr * (k + 1) / warmup_steps` for the averaging weight.

    ??? cite "References"

        ```bibtex
        @inproceedings{defazio2024road,
            title={The Road Less Scheduled},
            author={Defazio, Aaron and Yang, Xingyu and Mehta, Harsh and
                    Mishchenko, Konstantin and Khaled, Ahmed and Cutkosky, Ashok},
            booktitle={NeurIPS}, year={2024}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.ScheduleFreeSGD(1.0, warmup_steps=100)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        eval_params = opt.eval_params(state, params)
        ```
    """

    learning_rate: ScalarOrSchedule = 1.0
    warmup_steps: int | None = None
    b1: ScalarLike = 0.9
    weight_decay: ScalarOrSchedule | None = None
    weight_lr_power: ScalarLike = 2.0
    state_dtype: object = eqx.field(default=None, static=True)

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=(
                "learning_rate",
                "warmup_steps",
                "weight_decay",
                "weight_lr_power",
            ),
        )
        _check_b1(self)

    _state_buffers = {"z": False}

    def init(self, params: Params) -> ScheduleFreeSGDState:
        count, max_lr, weight_sum = _init_scalars(params)
        return ScheduleFreeSGDState(
            count, max_lr, weight_sum, _init_z(params, self.state_dtype)
        )

    def update(
        self,
        grads: Updates,
        state: ScheduleFreeSGDState,
        params: Params | None = None,
        **extra,
    ) -> tuple[Updates, ScheduleFreeSGDState]:
        need_params(self, params, "the current point $y$")
        lr = _warmup(
            resolve(self.learning_rate, state.count),
            self.warmup_steps,
            state.count,
            state.max_lr.dtype,
        )
        max_lr, weight_sum, c = _averaging_weight(state, lr, self.weight_lr_power)
        wd = (
            None
            if self.weight_decay is None
            else resolve(self.weight_decay, state.count)
        )

        def _leaf(g, z, y):
            dtype = compute_dtype(g.dtype, dtype_of(z), y.dtype)
            g, z32, y32 = g.astype(dtype), read(z, dtype), y.astype(dtype)
            if wd is not None:
                g = g + scalar(wd, dtype) * y32
            u = -lr.astype(dtype) * g
            update, new_z = _y_step(
                u, z32, y32, c.astype(dtype), scalar(self.b1, dtype)
            )
            return pack(update.astype(y.dtype), write(new_z, z))

        updates, z = tree_map_unzip(
            _leaf, 2, grads, state.z, params, names=("grads", "state.z", "params")
        )
        new_state = ScheduleFreeSGDState(increment(state.count), max_lr, weight_sum, z)
        return updates, new_state

    def eval_params(self, state: ScheduleFreeSGDState, params: Params) -> Params:
        r"""The averaged point $x = (y - (1-\beta_1)\,z)/\beta_1$, to evaluate or
        checkpoint, in the params' dtype (leaves that are not optimised are returned
        unchanged). Matches `optax.contrib.schedule_free_eval_params`."""
        return _eval_params(self.b1, state.z, params)


ScheduleFreeSGD.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\gamma$; a number, an array, or a schedule (multiplied by the
    warm-up factor).
- `warmup_steps`: $T_{\rm warmup}$, the length of the linear warm-up, or `None`
    (default) for none.
- `b1`: the interpolation $\beta_1$ between $x$ and $z$, in `(0, 1]`.
- `weight_decay`: $\lambda$, evaluated at $y$ and multiplied by the learning rate;
    `None` (default) for none.
- `weight_lr_power`: $p$; the averaging weights are $\gamma_{\max}^p$.
- `state_dtype`: dtype of $z$; default the param's. An [`eqxopt.Quantized`][] (or a
    dict `{"z": ...}`) quantizes $z$, initially the params. (Static.)
"""


class ScheduleFreeAdamW(AbstractOptimizer[ScheduleFreeAdamWState]):
    r"""Schedule-free AdamW, fused (as the reference implementation).

    $$v_k = \beta_2 v_{k-1} + (1-\beta_2)\,g_k^2, \qquad
      d_k = \frac{g_k}{\sqrt{v_k / (1-\beta_2^{k+1})} + \epsilon} + \lambda\,y_k,$$

    $$\gamma_k = \gamma\,\min\!\left(1, \tfrac{k+1}{T_{\rm warmup}}\right), \qquad
      z_{k+1} = z_k - \gamma_k\,d_k,$$

    with $y$, $x$ and the averaging weights as in [`eqxopt.ScheduleFree`][] (the
    warmed-up $\gamma_k$ is used in both places; $\beta_1$ is the interpolation, there
    is no first moment). As in the current reference implementation, the bias correction
    of $v$ is applied inside the square root and does not enter the learning rate, hence
    not the averaging weights either (early versions of the reference folded
    $\sqrt{1-\beta_2^{k+1}}$ into $\gamma_k$). The params hold $y$;
    [`eqxopt.ScheduleFreeAdamW.eval_params`][] returns $x$.

    Without warm-up this matches `optax.contrib.schedule_free_adamw`. With warm-up it
    follows the reference (`AdamWScheduleFree`): the k-th update (k from 0) steps $z$
    with `lr * (k + 1) / warmup_steps`, where Optax uses `lr * k / warmup_steps` for the
    $z$ step (so Optax's first step is exactly zero). `state_dtype` sets the dtype of
    both $z$ and $v$ (Optax's applies to $z$ only).

    ??? cite "References"

        ```bibtex
        @inproceedings{defazio2024road,
            title={The Road Less Scheduled},
            author={Defazio, Aaron and Yang, Xingyu and Mehta, Harsh and
                    Mishchenko, Konstantin and Khaled, Ahmed and Cutkosky, Ashok},
            booktitle={NeurIPS}, year={2024}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.ScheduleFreeAdamW(1e-3, warmup_steps=1000, weight_decay=1e-4)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        eval_params = opt.eval_params(state, params)
        ```
    """

    learning_rate: ScalarOrSchedule = 0.0025
    warmup_steps: int | None = None
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    weight_decay: ScalarOrSchedule = 0.0
    weight_lr_power: ScalarLike = 2.0
    state_dtype: object = eqx.field(default=None, static=True)

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=(
                "learning_rate",
                "warmup_steps",
                "eps",
                "weight_decay",
                "weight_lr_power",
            ),
            unit_interval=("b2",),
        )
        _check_b1(self)

    _state_buffers = {"z": False, "nu": True}

    def init(self, params: Params) -> ScheduleFreeAdamWState:
        count, max_lr, weight_sum = _init_scalars(params)
        nu = buffers_like(params, self.state_dtype, "nu", True)
        return ScheduleFreeAdamWState(
            count, max_lr, weight_sum, _init_z(params, self.state_dtype), nu
        )

    def update(
        self,
        grads: Updates,
        state: ScheduleFreeAdamWState,
        params: Params | None = None,
        **extra,
    ) -> tuple[Updates, ScheduleFreeAdamWState]:
        need_params(self, params, "the current point $y$")
        lr = _warmup(
            resolve(self.learning_rate, state.count),
            self.warmup_steps,
            state.count,
            state.max_lr.dtype,
        )
        max_lr, weight_sum, c = _averaging_weight(state, lr, self.weight_lr_power)
        wd = resolve(self.weight_decay, state.count)
        count = increment(state.count)

        def _leaf(g, z, v, y):
            dtype = compute_dtype(g.dtype, dtype_of(z), dtype_of(v), y.dtype)
            g32, z32, y32 = g.astype(dtype), read(z, dtype), y.astype(dtype)
            b2 = scalar(self.b2, dtype)
            v32 = b2 * read(v, dtype) + (1 - b2) * abs_sq(g32)
            v_hat = v32 / (1 - b2 ** count.astype(v32.dtype))
            d = g32 / (jnp.sqrt(v_hat) + scalar(self.eps, v32.dtype))
            d = d + scalar(wd, dtype) * y32
            u = -lr.astype(dtype) * d
            update, new_z = _y_step(
                u, z32, y32, c.astype(dtype), scalar(self.b1, dtype)
            )
            return pack(update.astype(y.dtype), write(new_z, z), write(v32, v))

        updates, z, nu = tree_map_unzip(
            _leaf,
            3,
            grads,
            state.z,
            state.nu,
            params,
            names=("grads", "state.z", "state.nu", "params"),
        )
        new_state = ScheduleFreeAdamWState(count, max_lr, weight_sum, z, nu)
        return updates, new_state

    def eval_params(self, state: ScheduleFreeAdamWState, params: Params) -> Params:
        r"""The averaged point $x = (y - (1-\beta_1)\,z)/\beta_1$, to evaluate or
        checkpoint, in the params' dtype (leaves that are not optimised are returned
        unchanged). Matches `optax.contrib.schedule_free_eval_params`."""
        return _eval_params(self.b1, state.z, params)


ScheduleFreeAdamW.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\gamma$; a number, an array, or a schedule (multiplied by the
    warm-up factor).
- `warmup_steps`: $T_{\rm warmup}$, the length of the linear warm-up, or `None`
    (default) for none.
- `b1`: the interpolation $\beta_1$ between $x$ and $z$, in `(0, 1]`.
- `b2`: decay rate $\beta_2$ of the second moment, in `[0, 1)`.
- `eps`: $\epsilon$, added outside the square root.
- `weight_decay`: $\lambda$, evaluated at $y$ and multiplied by the learning rate.
- `weight_lr_power`: $p$; the averaging weights are $\gamma_{\max}^p$.
- `state_dtype`: dtype of $z$ and $v$; default the param's. An
    [`eqxopt.Quantized`][] quantizes both, a dict keyed by `"z"` and `"nu"` each.
    (Static.)
"""
