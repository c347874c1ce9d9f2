"""Gradient accumulation: `MultiSteps`."""

from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int32, PyTree

from .._core.base import (
    AbstractOptimizer,
    check_optimizer,
    child_update,
    scalar_hyperparams,
)
from .._custom_types import Params, ScalarOrSchedule, Updates
from .._misc import (
    compute_dtype,
    increment,
    pack,
    resolve,
    sharded_like,
    tree_map,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, is_quantized, read, Stored, write
from .base import like_zero_updates, zero_updates


@typechecked
class MultiStepsState(eqx.Module):
    """State of [`eqxopt.MultiSteps`][].

    - `mini_step`: calls since the last inner update (`0 <= mini_step < every_k`).
    - `gradient_step`: inner updates applied so far; `every_k` (if a schedule) is
        evaluated at it.
    - `inner_state`: the wrapped optimizer's state, changed only at boundaries.
    - `acc_grads`: the running mean (or sum) of the current window's gradients, one
        leaf per param, in `accumulator_dtype` (default: the param's). The call that
        applies a window resets it to zero (with a select), so no state holds a NaN
        or inf from a window that was already applied.
    - `last_applied`: whether the last call applied an inner update.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.MultiSteps(eqxopt.SGD(0.1), every_k=2)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert state.mini_step == 1 and state.gradient_step == 0
        state.acc_grads["w"]  # the grads accumulated so far
        ```
    """

    mini_step: Int32[Array, ""]
    gradient_step: Int32[Array, ""]
    inner_state: Any
    acc_grads: PyTree[Stored]
    last_applied: Bool[Array, ""]


def _check_every_k(k, what: str) -> None:
    """`every_k`, or a schedule's concrete value, must be an integer >= 1."""
    if isinstance(k, jax.core.Tracer):
        return
    if (
        isinstance(k, (bool, np.bool_, str))
        or k is None
        or np.ndim(k) != 0
        or np.iscomplexobj(k)
        or not float(k) >= 1
        or float(k) != int(float(k))
    ):
        raise ValueError(
            f"`MultiSteps(every_k=...)` must be an integer >= 1 or a schedule of "
            f"such integers, got {what}{k!r}."
        )


def _every_k(value) -> Int32[Array, ""]:
    """A (possibly scheduled) window length as an int32 scalar, at least 1."""
    _check_every_k(value, "a schedule giving ")  # where the value is concrete
    k = jnp.asarray(value)
    if jnp.issubdtype(k.dtype, jnp.inexact):
        k = jnp.round(k)
    return jnp.maximum(k.astype(jnp.int32), jnp.ones((), jnp.int32))


class MultiSteps(AbstractOptimizer[MultiStepsState]):
    r"""Gradient accumulation: apply `optimizer` once every `every_k` calls, to the
    mean (or sum) of the gradients of those calls.

    With $g_1, \dots, g_k$ the gradients of one window, the call that completes it
    returns `optimizer`'s update for

    $$\bar g = \frac{1}{k} \sum_{i=1}^k g_i \ \text{(mean, the default)}
      \qquad\text{or}\qquad \bar g = \sum_{i=1}^k g_i \ \text{(sum)},$$

    and every other call returns zero updates. The mean is accumulated with Welford's
    update $a_i = a_{i-1} + (g_i - a_{i-1}) / i$ (as Optax), computed in at least
    float32 and stored in `accumulator_dtype`; the inner optimizer receives $\bar g$
    cast to the gradients' dtype (for bfloat16 params and float32 grads, pass
    `accumulator_dtype=jnp.float32` to keep the mean in float32).

    Between boundaries the inner state is not touched: the two cases are selected
    with `lax.cond`, so the inner optimizer's state is never blended or multiplied
    (its bools stay bools, whatever optimizer is wrapped). The accumulator is reset
    by a select, never by multiplying by zero: the first gradient of each window
    replaces it, so a NaN in one window never leaks into the next. An accumulating
    call reads the grads and the accumulator and writes the accumulator; `step`
    also leaves the model untouched. `every_k` may be a schedule, evaluated at the
    number of inner updates applied so far (`state.gradient_step`); Optax calls this
    `every_k_schedule`. Matches `optax.MultiSteps(...).gradient_transformation()`
    (whose accumulator is float32 by default: give it the params' dtype to compare).

    `MultiSteps(Chain(ZeroNans(), ...))` zeroes an entry for the whole window if any
    micro-batch had a NaN there (the inner optimizer sees the mean); use
    `Chain(ZeroNans(), MultiSteps(...))` to drop single micro-batch entries.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.MultiSteps(eqxopt.Adam(1e-3), every_k=4)
        state = opt.init(params)
        for micro_batch in range(4):
            params, state = opt.step(params, grads, state)  # moves on the 4th call
        assert state.gradient_step == 1
        ```
    """

    optimizer: AbstractOptimizer
    every_k: ScalarOrSchedule
    use_mean: bool = eqx.field(default=True, static=True)
    accumulator_dtype: Any = eqx.field(default=None, static=True)

    _state_buffers = {"acc_grads": False}

    def __check_init__(self):
        check_optimizer("MultiSteps", "optimizer", self.optimizer)
        k = self.every_k
        if callable(k) and not isinstance(k, (jax.Array, np.ndarray)):
            # A schedule is checked where its value is concrete: at the first window
            # here (unless built under a trace), and at every eager update.
            with jax.ensure_compile_time_eval():
                _check_every_k(k(jnp.zeros((), jnp.int32)), "a schedule giving ")
        else:
            _check_every_k(k, "")

    def init(self, params: Params) -> MultiStepsState:
        return MultiStepsState(
            mini_step=zero_count(),
            gradient_step=zero_count(),
            inner_state=self.optimizer.init(params),
            acc_grads=buffers_like(params, self.accumulator_dtype, "acc_grads", False),
            last_applied=jnp.zeros((), jnp.bool_),
        )

    def _accumulate(self, grads, state: MultiStepsState):
        """`(emit, acc, next_acc)`: whether this call completes a window, the window's
        running mean (or sum) including `grads`, and the accumulator to store (zero
        after a completed window), in one fused elementwise pass."""
        k = _every_k(resolve(self.every_k, state.gradient_step))
        n = state.mini_step
        emit = n + 1 >= k

        def _leaf(g, acc):
            dtype = compute_dtype(g.dtype, dtype_of(acc))
            acc32 = read(acc, dtype)
            g32 = (
                g.astype(dtype)
                if is_quantized(acc)
                else sharded_like(g.astype(dtype), acc)
            )
            if self.use_mean:
                new = acc32 + (g32 - acc32) / (n + 1).astype(dtype)  # Welford
            else:
                new = acc32 + g32
            # The first gradient of a window replaces the accumulator, and a completed
            # window leaves zeros: selects, so a NaN of one window can neither leak
            # into the next nor stay in the state. (Multiplying by zero would keep a
            # NaN: nan * 0 is nan.)
            if is_quantized(acc):  # the window's mean in float32, stored re-encoded
                new = jnp.where(n == 0, g32, new)
                return pack(new, write(jnp.where(emit, jnp.zeros_like(new), new), acc))
            new = jnp.where(n == 0, g32, new).astype(acc.dtype)
            return pack(new, jnp.where(emit, jnp.zeros_like(new), new))

        acc, next_acc = tree_map_unzip(
            _leaf, 2, grads, state.acc_grads, names=("grads", "state.acc_grads")
        )
        return emit, acc, next_acc

    def _inner_update(self, acc, grads, inner_state, params, extra):
        """The inner optimizer's update for the window's mean (in the grads' dtype)."""
        mean = tree_map(
            lambda g, a: a.astype(g.dtype), grads, acc, names=("grads", "acc")
        )
        updates, inner_state = child_update(
            self.optimizer, ".inner_state", mean, inner_state, params, **extra
        )
        zeros = zero_updates(grads, params)
        return like_zero_updates(updates, zeros, "MultiSteps"), inner_state

    def _new_state(self, state, emit, next_acc, inner_state) -> MultiStepsState:
        return MultiStepsState(
            mini_step=jnp.where(emit, zero_count(), increment(state.mini_step)),
            gradient_step=jnp.where(
                emit, increment(state.gradient_step), state.gradient_step
            ),
            inner_state=inner_state,
            acc_grads=next_acc,
            last_applied=emit,
        )

    def update(self, grads: Updates, state: MultiStepsState, params=None, **extra):
        emit, acc, next_acc = self._accumulate(grads, state)

        def _apply(acc, inner_state):
            return self._inner_update(acc, grads, inner_state, params, extra)

        def _skip(acc, inner_state):
            return zero_updates(grads, params), inner_state

        # The inner state is selected whole by `lax.cond`, never blended: between
        # boundaries it passes through untouched (in place inside a `lax.scan`; at
        # the top level of a jitted step, `step` with donated model and state).
        updates, inner_state = lax.cond(emit, _apply, _skip, acc, state.inner_state)
        return updates, self._new_state(state, emit, next_acc, inner_state)

    def step(self, model: Params, grads: Updates, state: MultiStepsState, **extra):
        """As [`eqxopt.AbstractOptimizer.step`][] (`update`, then
        `eqx.apply_updates`), with the updates applied inside the boundary branch:
        an accumulating call reads the grads and the accumulator, writes the
        accumulator, and leaves the model untouched (no zero updates are added)."""
        emit, acc, next_acc = self._accumulate(grads, state)
        dynamic, static = eqx.partition(model, eqx.is_array)

        def _apply(dynamic, acc, inner_state):
            model = eqx.combine(dynamic, static)
            updates, inner_state = self._inner_update(
                acc, grads, inner_state, model, extra
            )
            model = eqx.apply_updates(model, updates)
            return eqx.partition(model, eqx.is_array)[0], inner_state

        def _skip(dynamic, acc, inner_state):
            return dynamic, inner_state

        dynamic, inner_state = lax.cond(
            emit, _apply, _skip, dynamic, acc, state.inner_state
        )
        new_state = self._new_state(state, emit, next_acc, inner_state)
        return eqx.combine(dynamic, static), new_state

    def has_updated(self, state: MultiStepsState) -> Bool[Array, ""]:
        """Whether the call that returned `state` applied an inner update (as Optax's
        `MultiSteps.has_updated`)."""
        return state.last_applied

    def hyperparams(self, state: MultiStepsState) -> dict[str, Any]:
        out = scalar_hyperparams(self, state.gradient_step)
        out["optimizer"] = self.optimizer.hyperparams(state.inner_state)
        return out


MultiSteps.__init__.__doc__ = """**Arguments:**

- `optimizer`: the optimizer applied once per window.
- `every_k`: the window length: an integer >= 1, or a schedule `count -> scalar`
    evaluated at the number of inner updates applied so far (rounded to an integer,
    at least 1). Optax's `every_k_schedule`.
- `use_mean`: pass the mean of the window's gradients (default) or their sum.
    (Static.)
- `accumulator_dtype`: dtype of the accumulator; default the param's (Optax's default
    is float32). (Static.)
"""
