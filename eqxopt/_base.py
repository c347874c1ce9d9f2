"""The optimizer protocol and the one state-drift check behind API.md rule 5."""

import abc
import functools as ft
import os
from typing import Any, ClassVar, Generic

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Int32

from ._custom_types import Params, State, Updates
from ._misc import scalar_hyperparams, tree_map, typechecked


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
        self, optimizer: str, path: str, expected: str, got: str, culprit: str
    ):
        self.optimizer = optimizer
        self.path = path
        self.expected = expected
        self.got = got
        self.culprit = culprit
        raised_by = (
            "" if culprit == optimizer else f" (raised inside `{culprit}.update`)"
        )
        super().__init__(
            f"`{optimizer}.update` returned a state that drifted at `state{path}`: "
            f"it was {expected}, it came back {got}{raised_by}. Every `update` must "
            "return a state with exactly the tree structure, shapes, dtypes and weak "
            "types of the state it was given, so that the state can be a `lax.scan` "
            "carry or a `lax.cond` branch output and a jitted step compiles once. Cast "
            "the new leaf back (`new.astype(old.dtype)`), or set EQXOPT_CHECK_STATE=0 "
            "to switch this check off."
        )
        # Kept to locate this state inside an enclosing optimizer's state.
        self._state: Any = None


def check_enabled() -> bool:
    return os.environ.get("EQXOPT_CHECK_STATE", "1").strip().lower() not in (
        "0",
        "false",
        "no",
        "off",
    )


def describe(x) -> str:
    """`float32[3]`, `~float32[]` (weakly typed), `bool[2,2]`, or a Python type."""
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        x = jax.typeof(x)
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        weak = "~" if getattr(x, "weak_type", False) else ""
        return f"{weak}{np.dtype(x.dtype).name}[{','.join(map(str, x.shape))}]"
    return f"a Python {type(x).__name__} ({x!r})"


def _signature(tree):
    leaves, treedef = jtu.tree_flatten(tree)
    return treedef, tuple(describe(x) for x in leaves)


def first_drift(before, after) -> tuple[str, str, str] | None:
    """The first `(path, expected, got)` at which two states differ, or `None`."""
    leaves_b, treedef_b = jtu.tree_flatten_with_path(before)
    leaves_a, treedef_a = jtu.tree_flatten_with_path(after)
    if treedef_a != treedef_b:
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


def _locate(outer, inner) -> str | None:
    """The path of a subtree of `outer` that is, or looks exactly like, `inner`.

    A wrapper may hand its child a rebuilt copy of the child's state (e.g. inside a
    `lax.cond` branch), so after identity, subtrees are matched by structure and avals.
    """
    target = _signature(inner)
    found: list[str] = []

    def walk(node, path):
        if node is inner:
            found.insert(0, path)
            return
        if _signature(node) == target:
            found.append(path)
            return
        children = jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)[0]
        if len(children) == 1 and children[0][1] is node:
            return
        for p, child in children:
            walk(child, path + jtu.keystr(p))

    walk(outer, "")
    return found[0] if found else None


def _checked(update):
    """Wrap a concrete `update` with the drift check (API.md rule 5)."""

    @ft.wraps(update)
    def checked_update(self, grads, state, params=None, **extra):
        try:
            updates, new_state = update(self, grads, state, params, **extra)
        except StateDriftError as e:
            # A child drifted: prefix the path with where its state sits in ours.
            prefix = _locate(state, e._state) if e._state is not None else None
            if prefix is None:
                raise
            err = StateDriftError(
                type(self).__name__, prefix + e.path, e.expected, e.got, e.culprit
            )
            err._state = state
            raise err from None
        if check_enabled():
            drift = first_drift(state, new_state)
            if drift is not None:
                name = type(self).__name__
                err = StateDriftError(name, *drift, culprit=name)
                err._state = state
                raise err
        return updates, new_state

    checked_update._eqxopt_checked = True  # pyright: ignore
    return checked_update


class AbstractOptimizer(eqx.Module, Generic[State]):
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
        update = cls.__dict__.get("update")
        if (
            update is not None
            and callable(update)
            and not getattr(update, "__isabstractmethod__", False)
            and not getattr(update, "_eqxopt_checked", False)
        ):
            cls.update = _checked(update)  # pyright: ignore

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
    # buffer before overwriting it; adding an exact zero computed from the new params
    # orders the write after the params' update, so XLA writes it in place. The new
    # state equals `update`'s (a `-0.0` may become `+0.0`). Leaves under 4096 elements
    # are left alone: their copies cost nothing measurable, while every ordered leaf
    # adds trace and compile time.
    _write_after_params: ClassVar[tuple[str, ...]] = ()

    def step(self, model: Params, grads: Updates, state: State, **extra):
        """`update`, then `eqx.apply_updates`: returns `(new_model, new_state)`."""
        updates, state = self.update(grads, state, model, **extra)
        model = eqx.apply_updates(model, updates)

        def _order(s, p):
            if not eqx.is_inexact_array(p) or p.shape != s.shape or p.size < 4096:
                return s
            return s + jnp.where(jnp.isfinite(p), p * 0, 0).astype(s.dtype)

        for field in self._write_after_params:
            buffers = getattr(state, field)
            new = tree_map(_order, buffers, model, names=(field, "params"))
            state = eqx.tree_at(lambda s: getattr(s, field), state, new)
        return model, state

    def hyperparams(self, state: State) -> dict[str, Any]:
        """The value of every scalar hyperparameter the next update will use (schedules
        evaluated at the state's step count), keyed by field name."""
        return scalar_hyperparams(self, getattr(state, "count", None))


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
