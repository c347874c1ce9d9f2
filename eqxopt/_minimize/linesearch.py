"""Line searches: the protocol shared by [`eqxopt.Zoom`][] and
[`eqxopt.Backtracking`][], and the helpers they (and [`eqxopt.LBFGS`][]) use.

A line search is an optimizer whose `update` takes a *descent direction* as its
"grads" and returns `step_size * direction`, with the step chosen along the line by
evaluating `value_fn`. Its state keeps the loss and gradient at the accepted point, so a
caller can start the next iteration from them without evaluating the function again.
"""

import abc
import inspect
from collections.abc import Callable
from typing import Any, TYPE_CHECKING, TypeVar

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Bool, Float, Inexact, Int32, PyTree

from .._bounds import project
from .._core.base import AbstractOptimizer
from .._custom_types import Params, Updates
from .._misc import (
    compute_dtype,
    is_none,
    is_param,
    real_dtype,
    sharded_like,
    tree_map,
    zero_count,
    zeros_like,
)


# Abstract fields: type checkers see a `ClassVar` (as equinox does for its
# `AbstractClassVar`), so that their model of a final class's `__init__` takes its
# fields, in Optax's order, from the final class alone, as equinox does at run time.
if TYPE_CHECKING:
    from typing import ClassVar as AbstractVar
else:
    from equinox import AbstractVar


_S = TypeVar("_S")


class LineSearchResult(eqx.Enumeration):
    """How the last line search ended (the `result` field of a line search's state).

    `successful` and `sufficient_decrease_only` return a step; the three others are
    failures: the step is zero and the state's `failed` flag is set.

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt


        def loss(y):
            return jnp.sum((y - 1.0) ** 2)


        search, y = eqxopt.Zoom(), jnp.zeros(3)
        value, grad = jax.value_and_grad(loss)(y)  # +grad is an ascent direction:
        _, state = search.update(grad, search.init(y), y, value=value, value_fn=loss)
        assert state.result == eqxopt.LineSearchResult.not_descent and state.failed
        print(eqxopt.LineSearchResult[state.result])  # what went wrong, and the fix
        ```
    """

    successful = ""
    sufficient_decrease_only = (
        "The step satisfies the sufficient-decrease (Armijo) condition but not the "
        "curvature condition (the search interval became too small, or the maximum "
        "step size was reached)."
    )
    not_descent = (
        "The direction is not a descent direction (its slope `<grad, direction>` is "
        "not negative), so no step can decrease the loss. Pass `-grad` or a "
        "preconditioned version of it, and check the sign of the loss."
    )
    nonfinite = (
        "The loss or its slope was non-finite (inf or NaN) at the start point or at "
        "every trial step with sufficient decrease. Check `value_fn` and its domain; "
        "reparameterize constrained parameters."
    )
    max_steps_reached = (
        "No step with sufficient decrease was found within `max_steps` evaluations. "
        "Increase `max_steps`, rescale the direction, or check that `value_fn` and the "
        "gradient are consistent."
    )


def concrete_item(item):
    """An enumeration item whose value is a JAX (not NumPy) int32 array."""
    return jtu.tree_map(jnp.asarray, item)


def scalar_dtype(tree) -> np.dtype:
    """The dtype line-search arithmetic runs in: the params' real dtypes promoted,
    and at least float32."""
    leaves = [x for x in jtu.tree_leaves(tree) if is_param(x)]
    return compute_dtype(*(real_dtype(x.dtype) for x in leaves))


def store_dtype(tree, state_dtype=None) -> np.dtype:
    """The dtype of scalars kept in a state: `state_dtype`, else the widest real dtype
    among the params (never wider: no float64 scalar for float32 params)."""
    if state_dtype is not None:
        return real_dtype(state_dtype)
    leaves = [x for x in jtu.tree_leaves(tree) if is_param(x)]
    if not leaves:
        return np.dtype(jnp.float32)
    return max((real_dtype(x.dtype) for x in leaves), key=lambda d: d.itemsize)


def cast(x, dtype):
    """`x.astype(dtype)`, binding nothing when `x` has that dtype already."""
    return x if x.dtype == dtype else lax.convert_element_type(x, dtype)


def tree_vdot(a, b, dtype) -> Array:
    """`Re <a, b>` summed over the leaves (conjugating `a`), in `dtype`. (Real leaves
    by `lax` primitives: the same operations as `jnp.sum(x * y)`, without the
    `jax.numpy` wrappers' trace time.)"""

    def _leaf(x, y):
        cd = compute_dtype(x.dtype, y.dtype)
        x, y = cast(x, cd), cast(y, cd)
        if jnp.iscomplexobj(x):
            return jnp.real(jnp.sum(jnp.conj(x) * y)).astype(dtype)
        return cast(lax.reduce_sum(lax.mul(x, y), tuple(range(x.ndim))), dtype)

    out = np.zeros((), dtype)
    for x in jtu.tree_leaves(tree_map(_leaf, a, b, names=("a", "b"))):
        if x is not None:
            out = lax.add(out, x)
    return jnp.asarray(out)


def select(pred, a, b):
    """`jnp.where(pred, a, b)` for a scalar boolean `pred`, as one `lax.select`:
    `jnp.where` traces (and lowers) a nested `jit` per call, which the loops of
    [`eqxopt.minimize`][] would otherwise repeat dozens of times. `a` and `b` are
    arrays of one shape and dtype, or one of them a Python number (taken in the
    other's dtype, as `jnp.where` does with a weakly typed number)."""
    a, b = _no_scalar_type(a), _no_scalar_type(b)
    if not isinstance(a, (jax.Array, np.ndarray)):
        b = jnp.asarray(b)
        a = constant(a, b)
    elif not isinstance(b, (jax.Array, np.ndarray)):
        b = constant(b, a)
    if a.dtype != b.dtype or a.shape != b.shape or np.shape(pred) != ():
        return jnp.where(pred, a, b)
    pred = _no_scalar_type(pred)
    if not (isinstance(pred, (jax.Array, np.ndarray)) and pred.dtype == bool):
        pred = jnp.asarray(pred, bool)
    return lax.select(pred, a, b)


def _no_scalar_type(x):
    """A NumPy scalar as a 0-d NumPy array (an array, not a Python number)."""
    return np.asarray(x) if isinstance(x, np.generic) else x


def constant(value, like):
    """The Python number `value` in `like`'s dtype and shape, as `lax.full_like`; for
    a scalar `like`, a NumPy scalar (a literal in the trace: nothing to bind) where
    NumPy's conversion gives the same number (always for 0, 1, inf and NaN)."""
    if np.shape(like) == ():
        out = np.asarray(value, like.dtype)
        if out == value or (out != out and value != value):
            return out
    return lax.full_like(like, value)


# `x[i]` and `x.at[i].set(v)` for an index known to be in range: without the code
# that wraps negative indices (JAX >= 0.5.3 can leave it out), and without the
# nested `jit` that `lax.dynamic_index_in_dim` traces per call.
_IN_RANGE = (
    {"allow_negative_indices": False}
    if "allow_negative_indices" in inspect.signature(lax.dynamic_slice).parameters
    else {}
)


def index(x, i):
    """`x[i]` along the first axis, for an in-range index `i`."""
    i = jnp.asarray(i)
    starts = (i,) + (np.zeros((), i.dtype),) * (x.ndim - 1)
    out = lax.dynamic_slice(x, starts, (1,) + x.shape[1:], **_IN_RANGE)
    return lax.reshape(out, x.shape[1:])


def put(x, value, i):
    """`x.at[i].set(value)` along the first axis, for an in-range index `i`."""
    i = jnp.asarray(i)
    starts = (i,) + (np.zeros((), i.dtype),) * (x.ndim - 1)
    value = lax.reshape(jnp.asarray(value, x.dtype), (1,) + x.shape[1:])
    return lax.dynamic_update_slice(x, value, starts, **_IN_RANGE)


def tree_select(pred, a, b):
    """`a` where `pred` else `b`, leaf by leaf (`None` leaves stay `None`)."""
    return jtu.tree_map(
        lambda x, y: None if x is None else select(pred, x, y), a, b, is_leaf=is_none
    )


def conj(tree):
    """JAX's gradient of a real loss of complex params, conjugated: the gradient in
    Optax's (and eqxopt's) convention for updates, where `-conj(grad)` is the steepest
    descent direction. (Identity on real leaves.)"""
    return tree_map(lambda x: jnp.conj(x) if jnp.iscomplexobj(x) else x, tree)


def slope(grad, direction, dtype) -> Array:
    """The derivative of the loss along `direction`, `Re <grad, direction>`, for
    `grad` in the updates' convention (conjugated, as [`eqxopt.minimize`][] and Optax
    pass it for complex params), i.e. the real inner product of the real views."""
    return tree_vdot(grad, direction, dtype)


def cast_like(tree, like):
    """Each inexact leaf of `tree` cast to the dtype of the same leaf of `like` (and,
    on `Explicit` mesh axes, to its sharding: a state buffer may be split further
    than the params, by `shard_over`)."""
    return tree_map(
        lambda x, y: sharded_like(x.astype(y.dtype), y),
        tree,
        like,
        names=("tree", "like"),
    )


def step_updates(step, direction, params):
    """`step * direction`, per leaf in the direction's dtype, cast to the param's."""
    return tree_map(
        lambda d, p: (step.astype(d.dtype) * d).astype(p.dtype),
        direction,
        params,
        names=("direction", "params"),
    )


class ProjectedLoss(eqx.Module):
    """`params -> loss(P(params))`: a loss seen through the projection `P` onto the box
    `[lower, upper]` (full trees, as `broadcast_bounds` gives them). It is the
    `value_fn` that [`eqxopt.minimize`][] passes a projected method (an optimizer other
    than [`eqxopt.LBFGSB`][] with `bounds=`): called, it is that composition, so its
    derivative is zero in the variables that the projection clips. A line search
    (`value_and_grad_of`) evaluates it once per trial point: the loss and the gradient
    of `loss` at `P(point)`, the caller's next params."""

    loss: Callable
    lower: PyTree[Array]
    upper: PyTree[Array]

    def __call__(self, params):
        return self.loss(project(params, self.lower, self.upper))


class ProjectedValueAndGrad(eqx.Module):
    """`params -> (loss, grad)` at `P(params)` for a `ProjectedLoss`: the gradient
    of the loss at the projected point (what the caller needs there; not the
    derivative of the composition). `evaluate` takes the slope along the projected
    path from it (`path_grad`)."""

    value_and_grad_fn: Callable
    lower: PyTree[Array]
    upper: PyTree[Array]

    def __call__(self, params):
        return self.value_and_grad_fn(project(params, self.lower, self.upper))

    def path_grad(self, grad, params):
        """The derivative of `loss(P(params))` from `grad`, the gradient of `loss` at
        `P(params)`: zero where the projection clips `params` (outside the closed box;
        ties inside, as the projection's own derivative)."""
        return tree_map(
            lambda g, p, lo, up: jnp.where((p < lo) | (p > up), jnp.zeros_like(g), g),
            grad,
            params,
            self.lower,
            self.upper,
            names=("grad", "params", "lower", "upper"),
        )


def value_and_grad_of(value_fn):
    """The `value_and_grad_fn` a line search searches with: `value_fn`'s value and
    gradient, or for a `ProjectedLoss` a `ProjectedValueAndGrad`."""
    if isinstance(value_fn, ProjectedLoss):
        return ProjectedValueAndGrad(
            eqx.filter_value_and_grad(value_fn.loss), value_fn.lower, value_fn.upper
        )
    return eqx.filter_value_and_grad(value_fn)


def evaluate(value_and_grad_fn, params, direction, step, grad_like, dtype):
    """Loss, gradient (cast like `grad_like`) and slope at `params + step * direction`.
    The gradient is returned in the updates' convention (conjugated for complex
    params; `value_and_grad_fn` returns JAX's).

    The point is built with `eqx.apply_updates(params, step_updates(...))`, exactly as a
    caller applies the returned updates, so the cached loss and gradient are those of
    the caller's next params, bit for bit. With a `ProjectedValueAndGrad` they are
    those at the projected point, and the slope is the derivative along the projected
    path.
    """
    point = eqx.apply_updates(params, step_updates(step, direction, params))
    value, grad = value_and_grad_fn(point)
    value = jnp.real(jnp.asarray(value)).astype(dtype)
    grad = cast_like(conj(grad), grad_like)
    path = grad
    if isinstance(value_and_grad_fn, ProjectedValueAndGrad):
        path = value_and_grad_fn.path_grad(grad, point)
    return value, grad, slope(path, direction, dtype)


def direction_of(grads):
    """A direction tree in its compute dtype (at least float32)."""
    return tree_map(lambda u: u.astype(compute_dtype(u.dtype)), grads)


class Evaluation(eqx.Module):
    """The loss and gradient an optimizer already evaluated at the params its last
    update moved to, for the caller to reuse (see `AbstractLineSearchOptimizer`).

    - `value`, `grad`: the loss and its gradient there.
    - `failed`: whether the last update failed (it then returned a zero update).
    - `num_evals`: the evaluations the last update made.
    - `stalled`: whether the last update failed because its direction is below the
        resolution of the params (no trial point can differ from them by more than
        rounding): the limit of precision, not an error.
    """

    value: Float[Array, ""]
    grad: PyTree[Inexact[Array, "..."]]
    failed: Bool[Array, ""]
    num_evals: Int32[Array, ""]
    stalled: Bool[Array, ""]


def below_resolution(direction, params) -> Array:
    """Whether a unit step along `direction` moves no param by more than a few ulps."""
    out = jnp.ones((), bool)
    for d, p in zip(
        [x for x in jtu.tree_leaves(direction) if is_param(x)],
        [x for x in jtu.tree_leaves(params) if is_param(x)],
    ):
        real = real_dtype(d.dtype)
        eps = jnp.asarray(4 * float(jnp.finfo(p.dtype).eps), real)
        tiny = jnp.asarray(float(jnp.finfo(p.dtype).tiny), real)
        limit = eps * jnp.maximum(jnp.abs(p).astype(real), tiny)
        out = out & jnp.all(jnp.abs(d) <= limit)
    return out


class AbstractLineSearchOptimizer(AbstractOptimizer[_S]):
    """An optimizer whose `update` evaluates the loss (through `value_fn=`) at the
    point it moves to, and keeps that evaluation in its state.

    [`eqxopt.minimize`][] starts the next step from `last_evaluation(state)` instead of
    evaluating the loss again.
    """

    evaluates_loss = True

    @abc.abstractmethod
    def last_evaluation(self, state: _S) -> Evaluation | None:
        """The loss and gradient at the params after the last update, or `None` when
        this optimizer (as configured) keeps none."""


class AbstractLineSearchState(eqx.Module):
    """The fields every line search's state has (see [`eqxopt.ZoomState`][])."""

    step_size: AbstractVar[Float[Array, ""]]
    value: AbstractVar[Float[Array, ""]]
    grad: AbstractVar[PyTree[Inexact[Array, "..."]]]
    num_evals: AbstractVar[Int32[Array, ""]]
    failed: AbstractVar[Bool[Array, ""]]
    result: AbstractVar[LineSearchResult]


_L = TypeVar("_L", bound=AbstractLineSearchState)


class AbstractLineSearch(AbstractLineSearchOptimizer[_L]):
    """Base class of the line searches [`eqxopt.Zoom`][] and [`eqxopt.Backtracking`][].

    A line search is an optimizer: its `update(direction, state, params, *, value,
    value_fn, grad=None)` takes a descent direction in place of the gradients and
    returns `step_size * direction`, so that `eqxopt.Chain(eqxopt.Scale(-1.0),
    eqxopt.Zoom())` is gradient descent with a strong-Wolfe step. Subclasses implement
    `init` and `search`. The state they return keeps the step size, the loss `value`
    and gradient `grad` at the accepted point (reuse them to start the next step
    without another evaluation), the number of evaluations `num_evals`, a `failed`
    flag and a [`eqxopt.LineSearchResult`][] `result`. A failed search returns a zero
    step, never a NaN.

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt


        def loss(y):
            return jnp.sum((y - 1.0) ** 2)


        search, y = eqxopt.Backtracking(), jnp.zeros(3)
        assert isinstance(search, eqxopt.AbstractLineSearch)
        value, grad = jax.value_and_grad(loss)(y)  # search along -grad:
        step, state = search.update(
            -grad, search.init(y), y, value=value, value_fn=loss
        )
        assert state.value < value and jnp.allclose(y + step, 1.0)
        ```
    """

    @abc.abstractmethod
    def search(
        self,
        value_and_grad_fn: Callable[[Params], tuple[Any, Any]],
        params: Params,
        direction: Updates,
        value: Array,
        grad: Updates,
        state: _L,
        max_step: Array | None = None,
    ) -> tuple[Array, _L]:
        """Search along `direction` from `params`.

        **Arguments:**

        - `value_and_grad_fn`: `params -> (loss, grad)`. For a projected method (a
            `ProjectedValueAndGrad`), the loss and gradient at the projection
            of `params` onto the box; `evaluate` gives the slope along the
            projected path.
        - `params`: the start point.
        - `direction`: the search direction (a descent direction), in its compute
            dtype.
        - `value`, `grad`: the loss and its gradient at `params`.
        - `state`: this line search's state.
        - `max_step`: an upper bound on the step size (a scalar array; e.g. the end
            of the feasible segment in a bounded problem), or `None`.

        **Returns:**

        `(step_size, state)`: the step size as a scalar of the params' compute dtype
        (zero on failure), and the new state, whose `value` and `grad` are the loss
        and gradient at `params + step_size * direction`.
        """

    def update(
        self,
        grads: Updates,
        state: _L,
        params: Params | None = None,
        *,
        value=None,
        value_fn: Callable[[Params], Any] | None = None,
        grad: Updates | None = None,
        **extra,
    ) -> tuple[Updates, _L]:
        """Scale the descent direction `grads` by a step found along it.

        Needs `params` and `value_fn` (`params -> loss`); `value` (the loss at
        `params`) and `grad` (its gradient, as `jax.grad` returns it) are computed
        with one extra evaluation when not given. The state's `grad` is kept in the
        updates' convention (conjugated for complex params, as Optax's updates).
        """
        name = type(self).__name__
        if params is None or value_fn is None:
            raise ValueError(
                f"`{name}.update` needs `params` and the extra argument `value_fn=` "
                "(a function `params -> loss`), and ideally `value=` and `grad=` (the "
                "loss and its gradient at `params`)."
            )
        value_and_grad_fn = value_and_grad_of(value_fn)
        if value is None or grad is None:
            value0, grad0 = value_and_grad_fn(params)
            value = value0 if value is None else value
            grad = grad0 if grad is None else grad
        grad = conj(grad)  # JAX's convention -> the updates' (see `slope`)
        direction = direction_of(grads)
        step, new_state = self.search(
            value_and_grad_fn, params, direction, jnp.asarray(value), grad, state
        )
        return step_updates(step, direction, params), new_state

    def last_evaluation(self, state: _L) -> Evaluation:
        return Evaluation(
            state.value, state.grad, state.failed, state.num_evals, jnp.zeros((), bool)
        )


def after_search(
    state, memory, new_params, params, grads, direction, ls_state, dtype, new_grad=None
):
    """The memory after a line search (shared by LBFGS and LBFGSB): push the pair
    `(new_params - params, new_grad - grads)` (`new_grad`: the search's gradient at
    `new_params` unless given); a failed search drops the memory (the
    next direction is steepest descent, scaled by the last gamma). Returns the new
    `(s_memory, y_memory, rho_memory, head, gamma)` and the `stalled` / `failed`
    flags: a failure with an empty memory along a direction below the params'
    resolution, or along which a unit step's first-order decrease `|<g, d>|` is
    below the loss's resolution (no trial can show a decrease that rounding does not
    swamp), is the limit of precision, not an error."""
    s = memory_difference(new_params, params)
    y = memory_difference(ls_state.grad if new_grad is None else new_grad, grads)
    s_mem, y_mem, rho, head, gamma = memory
    s_mem, y_mem, rho, head, gamma = memory_push(
        s_mem, y_mem, rho, head, gamma, s, y, dtype
    )
    ls_failed = ls_state.failed
    was_empty = jnp.all(state.rho_memory == 0)
    rho = select(ls_failed, jnp.zeros_like(rho), rho)
    # On failure the search's `value` is the loss at `params`.
    f0 = jnp.abs(ls_state.value.astype(dtype))
    flat = jnp.abs(tree_vdot(grads, direction, dtype)) <= 4 * jnp.finfo(dtype).eps * f0
    stalled = ls_failed & was_empty & (below_resolution(direction, params) | flat)
    failed = ls_failed & was_empty & ~stalled
    return (s_mem, y_mem, rho, head, gamma), stalled, failed


def init_state(cls, params, state_dtype=None):
    dtype = store_dtype(params, state_dtype)
    return cls(
        step_size=jnp.ones((), dtype),
        value=jnp.full((), jnp.inf, dtype),
        grad=zeros_like(params, state_dtype),
        num_evals=zero_count(),
        failed=jnp.zeros((), bool),
        result=concrete_item(LineSearchResult.successful),
    )


def memory_push(state_s, state_y, rho, head, gamma, s, y, dtype):
    """Write the pair `(s, y)` at `head` if its curvature `<s, y>` is safely positive
    (skipping it otherwise, so the approximation stays positive definite)."""
    sy = tree_vdot(y, s, dtype)
    yy = tree_vdot(y, y, dtype)
    eps = jnp.finfo(dtype).eps
    valid = jnp.isfinite(sy) & jnp.isfinite(yy) & (sy > eps * yy) & (yy > 0)
    safe_sy = select(valid, sy, 1)
    safe_yy = select(valid, yy, 1)

    def push(buf, x):  # `head` is in range
        old = index(buf, head)
        # (`x` may be split further than the memory, from params-like state split by
        # `shard_over`: it is stored as the memory is sharded.)
        return put(buf, select(valid, sharded_like(x, old), old), head)

    def write(memory, new):
        return tree_map(
            lambda buf, x: push(buf, x.astype(buf.dtype)),
            memory,
            new,
            names=("memory", "pair"),
        )

    m = rho.shape[0]
    new_rho = push(rho, (1 / safe_sy).astype(rho.dtype))
    new_gamma = select(valid, (safe_sy / safe_yy).astype(gamma.dtype), gamma)
    new_head = select(valid, lax.rem(head + 1, jnp.int32(m)), head)
    return write(state_s, s), write(state_y, y), new_rho, new_head, new_gamma


def memory_difference(a, b):
    """`a - b` per leaf, in the compute dtype."""
    return tree_map(
        lambda x, y: (
            x.astype(compute_dtype(x.dtype, y.dtype))
            - y.astype(compute_dtype(x.dtype, y.dtype))
        ),
        a,
        b,
        names=("a", "b"),
    )
