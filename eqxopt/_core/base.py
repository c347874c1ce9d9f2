"""The optimizer protocol and the one state-drift check behind dtype rule 5.

How a drift's path is found: every concrete `init`, `update` and `step` is wrapped once,
when its class is defined. The wrapper of the call that returned the drifted state
raises a `StateDriftError` whose path is relative to that call's own state. A wrapper
optimizer calls each child through [`eqxopt.child_update`][], which knows where the
child's state sits (`.inner_state`, `[1]`, `['adam']`) and prefixes it; nothing is
searched for. The outermost call re-raises the error under its own name.
"""

import abc
import dataclasses
import functools as ft
import os
import threading
import typing
from typing import Any, ClassVar, Generic

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Int32

from .._checks import check_scalar_fields
from .._custom_types import Params, State, Updates
from .._misc import (
    is_none,
    is_param,
    only_params,
    real_dtype,
    STATE_CLASSES,
    tree_map,
    typechecked,
    write_after,
)
from .._quantized import check_storage, is_quantized


class StateDriftError(TypeError):
    """An `update` returned a state whose structure, shape, dtype or weak type differs
    from the state it was given.

    Raised at trace time. `path` is the leaf's path from the outermost optimizer's state
    (`jax.tree_util.keystr` form, e.g. `.inner_state[1].found_nan`); `expected` and
    `got` describe the leaf before and after.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}


        class CountFloat(eqxopt.AbstractOptimizer):  # a buggy optimizer
            def init(self, params):
                return {"n": jnp.zeros((), jnp.int32)}

            def update(self, grads, state, params=None, **extra):
                return grads, {"n": state["n"] + 1.0}  # int32 becomes float


        try:
            eqxopt.verify(CountFloat(), params)
        except eqxopt.StateDriftError as e:
            error = e
        assert error.path == "['n']" and error.expected == "int32[]"
        print(error)  # ... drifted at `state['n']`: it was int32[], it came back ...
        ```
    """

    def __init__(
        self,
        optimizer: str,
        path: str,
        expected: str,
        got: str,
        culprit: str,
        method: str = "update",
    ):
        self.optimizer = optimizer
        self.path = path
        self.expected = expected
        self.got = got
        self.culprit = culprit
        self.method = method
        if method == "init":
            message = (
                f"`{optimizer}.init` returned a state whose leaf `state{path}` is "
                f"{got}, not {expected}. States hold only JAX arrays of fixed dtype "
                "and no weak types (build them as `jnp.zeros((), jnp.int32)`, not "
                "`jnp.asarray(0)` or a Python number), so that `init`'s state and "
                "`update`'s have the same types and a jitted step compiles once."
            )
        else:
            raised_by = (
                "" if culprit == optimizer else f" (raised inside `{culprit}.{method}`)"
            )
            message = (
                f"`{optimizer}.{method}` returned a state that drifted at "
                f"`state{path}`: it was {expected}, it came back {got}{raised_by}. "
                "Every `update` must return a state with exactly the tree structure, "
                "shapes, dtypes and weak types of the state it was given, so that the "
                "state can be a `lax.scan` carry or a `lax.cond` branch output and a "
                "jitted step compiles once. "
                + (
                    "Return the same state class, with the same fields and containers "
                    "(build it as `init` does)"
                    if _is_structural(expected, got)
                    else "Cast the new leaf back (`new.astype(old.dtype)`)"
                )
                + ", or set EQXOPT_CHECK_STATE=0 to switch this check off."
            )
        super().__init__(message)
        # Where `path` starts: at the state of the call that raised this error (the
        # default), at the state of the wrapper that called it through `child_update`
        # (`_located`), or somewhere no caller can place (`_lost`: a child was called
        # without `child_update`).
        self._located = False
        self._lost = False
        self._raised_on: Any = None  # the optimizer whose `update` found the drift

    def _replace(self, **changes) -> "StateDriftError":
        fields = dict(
            optimizer=self.optimizer,
            path=self.path,
            expected=self.expected,
            got=self.got,
            culprit=self.culprit,
            method=self.method,
        )
        fields.update(changes)
        return StateDriftError(**fields)


def check_enabled() -> bool:
    return os.environ.get("EQXOPT_CHECK_STATE", "1").strip().lower() not in (
        "0",
        "false",
        "no",
        "off",
    )


def describe(x) -> str:
    """`float32[3]`, `~float32[]` (weakly typed), `key<fry>[]`, `bool[2,2]`, or a
    Python type."""
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        x = jax.typeof(x)
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        weak = "~" if getattr(x, "weak_type", False) else ""
        dtype = x.dtype
        name = (
            str(dtype)
            if jnp.issubdtype(dtype, jax.dtypes.extended)
            else np.dtype(dtype).name
        )
        return f"{weak}{name}[{','.join(map(str, x.shape))}]"
    return f"a Python {type(x).__name__} ({x!r})"


def first_drift(before, after) -> tuple[str, str, str] | None:
    """The first `(path, expected, got)` at which two states differ, or `None`."""
    leaves_b, treedef_b = jtu.tree_flatten_with_path(before)
    leaves_a, treedef_a = jtu.tree_flatten_with_path(after)
    if treedef_a != treedef_b:
        node = _first_node_change(before, after, "")
        if node is not None:
            return node
        # Report the first path present in one and not the other, else the node.
        paths_b = {jtu.keystr(p) for p, _ in leaves_b}
        paths_a = {jtu.keystr(p) for p, _ in leaves_a}
        for path, leaf in leaves_b:
            if jtu.keystr(path) not in paths_a:
                return jtu.keystr(path), describe(leaf), "missing"
        for path, leaf in leaves_a:
            if jtu.keystr(path) not in paths_b:
                return jtu.keystr(path), "absent", describe(leaf)
        return "", f"a tree {treedef_b}", f"a tree {treedef_a}"
    for (path, b), (_, a) in zip(leaves_b, leaves_a):
        db, da = describe(b), describe(a)
        if db != da:
            return jtu.keystr(path), db, da
    return None


def _node(x) -> str:
    name = type(x).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} `{name}`"


def _first_node_change(before, after, path: str) -> tuple[str, str, str] | None:
    """The shallowest `(path, expected, got)` where a container changed type (a dict
    returned for a state Module), or `None`."""
    if type(before) is not type(after):
        is_leaf_b = not jtu.tree_leaves(before, is_leaf=lambda x: x is not before)
        is_leaf_a = not jtu.tree_leaves(after, is_leaf=lambda x: x is not after)
        if not (is_leaf_b and is_leaf_a):
            return path, _node(before), _node(after)
        return None
    children_b = jtu.tree_flatten_with_path(before, is_leaf=lambda x: x is not before)
    children_a = jtu.tree_flatten_with_path(after, is_leaf=lambda x: x is not after)
    paths_a = {jtu.keystr(p): c for p, c in children_a[0]}
    for p, child in children_b[0]:
        key = jtu.keystr(p)
        if key in paths_a and child is not before:
            found = _first_node_change(child, paths_a[key], path + key)
            if found is not None:
                return found
    return None


def _is_structural(expected: str, got: str) -> bool:
    """Whether a drift is of the tree's structure, not of one leaf's type."""
    return (
        got in ("missing", "absent")
        or expected in ("missing", "absent")
        or (expected.startswith(("a ", "an ")) and got.startswith(("a ", "an ")))
    )


def _init_problem(state) -> tuple[str, str, str] | None:
    """The first leaf of a fresh state that is not a strongly typed array."""
    for path, leaf in jtu.tree_flatten_with_path(state)[0]:
        got = describe(leaf)
        if not isinstance(
            leaf, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)
        ):
            return jtu.keystr(path), "a JAX array", got
        if got.startswith("~"):
            return jtu.keystr(path), got[1:], got
    return None


# The calls in progress on this thread, as `(id(optimizer), method)`: a call whose
# optimizer and method are already innermost is an override's `super().update(...)`,
# which is not checked on its own (the override may repair the state it returns).
_active = threading.local()


def _stack() -> list:
    if not hasattr(_active, "calls"):
        _active.calls = []
    return _active.calls


def child_update(
    child: "AbstractOptimizer",
    path: str,
    grads: Updates,
    state: Any,
    params: Params | None = None,
    **extra,
) -> tuple[Updates, Any]:
    """Call `child.update(grads, state, params, **extra)` from inside a wrapper.

    `path` is where the child's state sits inside the wrapper's state, in
    `jax.tree_util.keystr` form (`".inner_state"`, `"[1]"`, `".inner_states['adam']"`).
    A [`eqxopt.StateDriftError`][] raised by the child is re-raised with the path
    prefixed, so the error the user sees names the leaf from the outermost state.
    Every built-in wrapper calls its children this way; a user-written wrapper should
    too (one that calls `child.update` directly still gets the error, with the path
    inside the child's state).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        class Twice(eqxopt.AbstractOptimizer):  # apply `inner` twice per call
            inner: eqxopt.AbstractOptimizer

            def init(self, params):
                return self.inner.init(params)

            def update(self, grads, state, params=None, **extra):
                for _ in range(2):
                    grads, state = eqxopt.child_update(
                        self.inner, "", grads, state, params, **extra
                    )
                return grads, state


        params = {"w": jnp.ones(3)}
        opt = Twice(eqxopt.SGD(0.1))
        params, state = opt.step(params, {"w": jnp.ones(3)}, opt.init(params))
        assert jnp.allclose(params["w"], 1 + 0.1 * 0.1)  # -0.1 * (-0.1 * grad)
        ```
    """
    try:
        return child.update(grads, state, params, **extra)
    except StateDriftError as e:
        if e._lost:
            raise
        err = e._replace(path=path + e.path)
        err._located = True
        raise err from None


def _reraise(self, e: StateDriftError, method: str) -> typing.NoReturn:
    """Re-raise a drift found inside the call `self.method` under that call's name."""
    name = type(self).__name__
    if e._located or e._raised_on is self:  # e.g. the base `step`'s own `update`
        err = e._replace(optimizer=name, method=method)
        err._raised_on = self  # its path now starts at `self`'s state
        raise err from None
    # The child was called without `child_update`: its path is inside the child's
    # state, and nothing above can place it.
    e._lost = True
    raise e


def _state_type(cls) -> type | None:
    """The state class `cls` declares (`AbstractOptimizer[AdamState]`), if any."""
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(base)
            if isinstance(origin, type) and issubclass(origin, AbstractOptimizer):
                (arg,) = typing.get_args(base) or (None,)
                arg = typing.get_origin(arg) or arg
                if arg is Any or not isinstance(arg, type):
                    return None  # `AbstractOptimizer[Any]`, or a TypeVar
                return arg
    return None


def _check_arguments(opt, grads, state) -> None:
    """Trace-time check of `update`'s arguments: grads and state in the right order.
    (Grads of the wrong shape are named by `tree_map`, where they meet the params or
    a state buffer: per-example grads, as `DPSGD` takes, may differ from the params.)"""
    name = type(opt).__name__
    if isinstance(grads, eqx.Module) and type(grads) in STATE_CLASSES:
        raise TypeError(
            f"`{name}.update(grads, state, params)` got a `{type(grads).__name__}` as "
            "`grads`: that is an optimizer state. Were `grads` and `state` passed in "
            "the wrong order?"
        )
    expected = _state_type(type(opt))
    if expected is not None and not isinstance(state, expected):
        swapped = " Were `grads` and `state` passed in the wrong order?" * (
            isinstance(grads, expected)
        )
        raise TypeError(
            f"`{name}.update(grads, state, params)` expects as `state` a "
            f"`{expected.__name__}` (what `{name}.init` returns), got a "
            f"`{type(state).__name__}`.{swapped}"
        )


def _check_step_arguments(opt, model, grads, state) -> None:
    """Trace-time checks of `step`'s arguments: `model` and `grads` in the right order,
    and a state that still mirrors the model's dtypes (dtype rule 1)."""
    name = type(opt).__name__
    for path, leaf in jtu.tree_flatten_with_path(grads)[0]:
        if not (eqx.is_array_like(leaf) or leaf is None):
            raise TypeError(
                f"`{name}.step(model, grads, state)` got a {type(leaf).__name__} at "
                f"`grads{jtu.keystr(path)}`: grads hold arrays (or None, as "
                "`eqx.filter_grad` gives for the leaves that are not differentiated). "
                "Were `model` and `grads` passed in the wrong order?"
            )
    if getattr(opt, "state_dtype", "") is not None or not dataclasses.is_dataclass(
        state
    ):
        return
    params = jtu.tree_flatten_with_path(model)[0]
    if not any(is_param(p) for _, p in params):
        return
    structure = jtu.tree_structure(only_params(model), is_leaf=is_none)
    for field in dataclasses.fields(state):
        buffers = getattr(state, field.name)
        if jtu.tree_structure(only_params(buffers), is_leaf=is_none) != structure:
            continue
        for (path, p), b in zip(params, jtu.tree_leaves(buffers, is_leaf=is_none)):
            if not (is_param(p) and is_param(b)) or p.shape != b.shape or p.ndim == 0:
                continue
            if real_dtype(p.dtype) != real_dtype(b.dtype):
                where = jtu.keystr(path)
                raise ValueError(
                    f"`{name}.step`: `state.{field.name}{where}` is {b.dtype} but the "
                    f"param `model{where}` is {p.dtype}: the state was initialised "
                    "for params of another dtype and no longer mirrors them. "
                    f"Initialise it on these params (`{name}.init(model)`), or pass "
                    f"`state_dtype=jnp.{b.dtype}` to keep {b.dtype} state."
                )


def _check_real(opt, params) -> None:
    """The `ValueError` of an optimizer that takes real params only, at `init`."""
    for path, x in jtu.tree_flatten_with_path(params)[0]:
        if is_param(x) and jnp.iscomplexobj(x):
            name = type(opt).__name__
            raise ValueError(
                f"`{name}` takes real params only ({opt.real_only}), but the "
                f"leaf at `{jtu.keystr(path) or 'the params'}` is {x.dtype}. Wrap it "
                f"as `eqxopt.SplitRealAndImaginary({name}(...))` to optimise the real "
                "and imaginary parts as real params."
            )


def _checked(method: str, fn):
    """Wrap a concrete `init`, `update` or `step` with the state checks (dtype rules
    5 and 8)."""

    def _enter(self) -> bool:
        key = (id(self), method)
        stack = _stack()
        if stack and stack[-1] == key:
            return False  # `super().update(...)` inside an override
        stack.append(key)
        return True

    if method == "init":

        @ft.wraps(fn)
        def checked_init(self, params):
            if not _enter(self):
                return fn(self, params)
            try:
                if self.real_only:
                    _check_real(self, params)
                state = fn(self, params)
            finally:
                _stack().pop()
            if check_enabled():
                problem = _init_problem(state)
                if problem is not None:
                    name = type(self).__name__
                    raise StateDriftError(name, *problem, culprit=name, method="init")
            return state

        wrapped = checked_init

    elif method == "update":

        @ft.wraps(fn)
        def checked_update(self, grads, state, params=None, **extra):
            if not _enter(self):
                return fn(self, grads, state, params, **extra)
            name = type(self).__name__
            try:
                _check_arguments(self, grads, state)
                updates, new_state = fn(self, grads, state, params, **extra)
            except StateDriftError as e:
                _reraise(self, e, method)
            finally:
                _stack().pop()
            if check_enabled():
                drift = first_drift(state, new_state)
                if drift is not None:
                    err = StateDriftError(name, *drift, culprit=name, method=method)
                    err._raised_on = self
                    raise err
            return updates, new_state

        wrapped = checked_update

    else:

        @ft.wraps(fn)
        def checked_step(self, model, grads, state, **extra):
            if not _enter(self):
                return fn(self, model, grads, state, **extra)
            name = type(self).__name__
            try:
                _check_step_arguments(self, model, grads, state)
                new_model, new_state = fn(self, model, grads, state, **extra)
            except StateDriftError as e:
                _reraise(self, e, method)
            finally:
                _stack().pop()
            if check_enabled():
                drift = first_drift(state, new_state)
                if drift is not None:
                    raise StateDriftError(name, *drift, culprit=name, method=method)
            return new_model, new_state

        wrapped = checked_step

    wrapped._eqxopt_checked = True  # pyright: ignore[reportAttributeAccessIssue]
    return wrapped


class AbstractSolver(eqx.Module):
    """What a solver declares to the solve that drives it ([`eqxopt.minimize`][] or
    [`eqxopt.least_squares`][]): class-level facts, read in one place by the solve
    (its argument checks and its step), which never tests a solver's class. The base
    of every optimizer, of the least-squares solvers and of
    [`eqxopt.AugmentedLagrangian`][].

    - `solves`: the problem it takes: `"loss"` (a scalar `fn`, `minimize`),
        `"residuals"` (`least_squares`) or `"constraints"` (`minimize(...,
        constraints=...)`).
    - `bounds_aware`: it takes `bounds=(lower, upper)` itself and keeps every iterate
        in the box (L-BFGS-B's model, the reflective trust region); else `minimize`
        projects each step onto the box.
    - `refuses_bounds`: non-empty in a solver that takes no bounds: why, and what to
        use instead (the solve raises a `ValueError` saying so).
    - `real_only`: non-empty in a solver that takes real `y0` only: why, or what to
        do with complex leaves. The solve raises a `ValueError` saying so before it
        starts; an optimizer (which may also be used without a solve) raises it in
        its `init`, naming the complex leaf.
    - `evaluates_loss`: its `update` evaluates the loss itself (through `value_fn=`)
        at the point it moves to and keeps that evaluation (`last_evaluation(state)`),
        which starts the next step of `minimize` instead of a new evaluation.
    - `rejects_steps`: a trust-region method, whose rejected trial steps leave the
        point (they are not steps without decrease); it says itself when it can no
        longer move.
    - `state_stats`: fields of its state that the solve reports in `stats`.
    """

    solves: ClassVar[str] = "loss"
    bounds_aware: ClassVar[bool] = False
    refuses_bounds: ClassVar[str] = ""
    real_only: ClassVar[str] = ""
    evaluates_loss: ClassVar[bool] = False
    rejects_steps: ClassVar[bool] = False
    state_stats: ClassVar[tuple[str, ...]] = ()


class AbstractOptimizer(AbstractSolver, Generic[State]):
    """Base class of every optimizer, transform, wrapper and line search.

    Subclasses implement `init` and `update`; `step` and `hyperparams` come for free.
    Every concrete `update`, built in or written by a user, is wrapped once, when its
    class is defined, by a trace-time check that the state it returns has exactly the
    structure, shapes, dtypes and weak types of the state it was given; a violation
    raises [`eqxopt.StateDriftError`][] naming the leaf's path.

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt


        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}


        class SignDescent(eqxopt.AbstractOptimizer):
            learning_rate: float

            def init(self, params):
                return eqxopt.EmptyState()

            def update(self, grads, state, params=None, **extra):
                step = lambda g: -self.learning_rate * jnp.sign(g)
                return jax.tree.map(step, grads), state


        opt = SignDescent(0.1)
        params, state = opt.step(params, grads, opt.init(params))
        ```
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for method in ("init", "update", "step"):
            fn = cls.__dict__.get(method)
            if (
                fn is not None
                and callable(fn)
                and not getattr(fn, "__isabstractmethod__", False)
                and not getattr(fn, "_eqxopt_checked", False)
            ):
                setattr(cls, method, _checked(method, fn))

    def __check_init__(self):
        # Every field annotated as a scalar hyperparameter must be a real scalar or a
        # schedule (design.md#protocol); ranges are checked by each class.
        check_scalar_fields(self)
        # A quantized or per-buffer `state_dtype` must fit the buffers the optimizer
        # declares (docs/memory_precision.md).
        for field in ("state_dtype", "accumulator_dtype"):
            if hasattr(self, field):
                check_storage(self, field, self._param_buffers())

    # The state buffers that mirror params, `{field name: non-negative}`, read and
    # written through `eqxopt._quantized` (so `state_dtype` may quantize them); `None`
    # for an optimizer whose `state_dtype` takes dtypes only.
    _state_buffers: ClassVar[dict[str, bool] | None] = None

    def _param_buffers(self) -> dict[str, bool] | None:
        """This instance's param-mirroring buffers (`_state_buffers` by default; an
        optimizer whose buffers depend on its options overrides this)."""
        return self._state_buffers

    @abc.abstractmethod
    def init(self, params: Params) -> State:
        """Build the initial state for `params` (any PyTree; only inexact arrays are
        optimised)."""

    @abc.abstractmethod
    def update(
        self, grads: Updates, state: State, params: Params | None = None, **extra
    ) -> tuple[Updates, State]:
        """Turn `grads` into updates to be *added* to the params, and a new state with
        exactly the structure and dtypes of `state`."""

    # State fields (trees mirroring the params) that `step` writes after the new
    # params. When a state buffer is read both by the update and by its own new value
    # (or its new value is a plain copy of the grads), XLA on CPU copies the donated
    # buffer before overwriting it; `write_after` (`_misc.py`) orders the write
    # after the params' update, so XLA writes it in place. The new state equals
    # `update`'s bit for bit. Leaves under 4096 elements
    # are left alone: their copies cost nothing measurable, while every ordered leaf
    # adds trace and compile time.
    _write_after_params: ClassVar[tuple[str, ...]] = ()

    def step(
        self, model: Params, grads: Updates, state: State, **extra
    ) -> tuple[Params, State]:
        """`update`, then `eqx.apply_updates`: returns `(new_model, new_state)`."""
        updates, state = self.update(grads, state, model, **extra)
        model = eqx.apply_updates(model, updates)

        def _order(s, p):
            if (
                is_quantized(s)
                or not eqx.is_inexact_array(p)
                or p.shape != s.shape
                or p.size < 4096
            ):
                return s
            return write_after(s, p)

        for field in self._write_after_params:
            buffers = getattr(state, field)
            new = tree_map(_order, buffers, model, names=(field, "params"))
            state = eqx.tree_at(lambda s: getattr(s, field), state, new)
        return model, state

    def hyperparams(self, state: State) -> dict[str, Any]:
        """The value of every scalar hyperparameter the next update will use (schedules
        evaluated at the state's step count), keyed by field name."""
        return scalar_hyperparams(self, getattr(state, "count", None))


# The base `step` is checked too (an override of it is wrapped in `__init_subclass__`).
AbstractOptimizer.step = _checked("step", AbstractOptimizer.step)  # pyright: ignore


def scalar_hyperparams(opt, count: Array | None) -> dict[str, Any]:
    """The current value of every scalar hyperparameter field of `opt`.

    A field counts when it holds a number, a 0-d array or a schedule; static fields,
    filter specs and child optimizers do not. Schedules are evaluated at `count`.
    """
    out = {}
    for field in dataclasses.fields(opt):
        if field.metadata.get("static") or field.metadata.get("eqxopt_filter_spec"):
            continue
        value = getattr(opt, field.name)
        if value is None or isinstance(value, (bool, AbstractOptimizer)):
            continue
        if isinstance(value, (int, float)):
            out[field.name] = value
        elif isinstance(value, (jax.Array, np.ndarray)) and np.ndim(value) == 0:
            out[field.name] = value
        elif callable(value) and not isinstance(value, type):
            if count is not None:
                out[field.name] = value(count)
    return out


def check_optimizer(wrapper: str, name: str, value) -> None:
    """`ValueError` unless `value` is an eqxopt optimizer (shared by the wrappers)."""
    if not isinstance(value, AbstractOptimizer):
        raise ValueError(
            f"`{wrapper}({name}=...)` must be an eqxopt optimizer, got "
            f"{type(value).__name__}. Wrap Optax transforms with `eqxopt.from_optax`."
        )


@typechecked
class EmptyState(eqx.Module):
    """The state of a stateless optimizer or transform.

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.Centralize().init(params)  # a stateless transform
        assert isinstance(state, eqxopt.EmptyState)
        assert jax.tree.leaves(state) == []  # nothing to store or checkpoint
        ```
    """


@typechecked
class CountState(eqx.Module):
    """The state of a transform that only counts its updates (to evaluate schedules).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        opt = eqxopt.PolyakSGD()  # keeps nothing but a step count
        state = opt.init(params)
        assert isinstance(state, eqxopt.CountState) and state.count.dtype == jnp.int32
        ```
    """

    count: Int32[Array, ""]
