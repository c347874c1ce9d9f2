"""Optax interoperation: `to_optax` (eqxopt to Optax), `from_optax` (Optax to eqxopt).

Optax is an optional dependency: it is imported inside the functions, never when
`eqxopt` is imported.
"""

import inspect
from typing import Any

import equinox as eqx
import jax
from jaxtyping import PyTree

from ._core.base import AbstractOptimizer
from ._custom_types import Params, Updates
from ._misc import (
    is_param,
    out_dtype,
    strong,
    tree_map,
    typechecked,
)


# The attribute `to_optax` sets on its `update` function, so that `from_optax` can
# unwrap a round trip instead of wrapping twice.
_ORIGIN = "__eqxopt_optimizer__"


def _import_optax(caller: str):
    try:
        import optax
    except ImportError as e:
        raise ImportError(
            f"`eqxopt.{caller}` needs Optax, an optional dependency of eqxopt. "
            "Install it with `pip install eqxopt[optax]` (or `pip install optax`)."
        ) from e
    return optax


def to_optax(opt: AbstractOptimizer) -> Any:
    """Use an eqxopt optimizer wherever an Optax gradient transformation is expected.

    Returns an `optax.GradientTransformationExtraArgs` whose `init` is `opt.init` and
    whose `update(updates, state, params=None, **extra_args)` is `opt.update`: extra
    arguments (`value=`, `value_fn=`, ...) are forwarded, so it composes with
    `optax.chain`, `optax.MultiSteps`, Flax's train states and
    `optimistix.OptaxMinimiser`. The Optax-side state is the eqxopt state itself (an
    `eqx.Module`, hence a PyTree), still checked for drift at every update.

    Like Optax's own transformations, `init` and `update` are plain functions
    (closures over `opt`), so `jax.jit(tx.update)` works even when `opt` holds array
    hyperparameters (they are then compile-time constants; keep `opt` itself as the
    argument of an `eqx.filter_jit`-ed step to change them without recompiling).

    `to_optax(eqxopt.from_optax(tx))` returns `tx` itself.

    !!! Example

        ```python
        import jax.numpy as jnp
        import optax

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        tx = optax.chain(optax.clip(1.0), eqxopt.to_optax(eqxopt.AdamW(1e-3)))
        state = tx.init(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        ```

    Raises `ImportError` naming the `optax` extra when Optax is not installed.
    """
    optax = _import_optax("to_optax")
    if isinstance(opt, FromOptax):
        return opt.tx
    if not isinstance(opt, AbstractOptimizer):
        raise TypeError(
            "`eqxopt.to_optax(opt)` takes an eqxopt optimizer (an "
            f"`eqxopt.AbstractOptimizer`), got {type(opt).__name__}."
        )

    def init(params: Params):
        return opt.init(params)

    def update(updates: Updates, state, params: Params | None = None, **extra_args):
        return opt.update(updates, state, params, **extra_args)

    setattr(update, _ORIGIN, opt)
    return optax.GradientTransformationExtraArgs(init, update)


@typechecked
class FromOptaxState(eqx.Module):
    """State of [`eqxopt.FromOptax`][]: the wrapped Optax transformation's own state
    (typically NamedTuples of arrays), as one field so that drift is reported at paths
    such as `.inner_state[0].mu['w']`.

    !!! Example

        ```python
        import jax.numpy as jnp
        import optax

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        opt = eqxopt.from_optax(optax.adam(1e-3))
        state = opt.init(params)
        assert isinstance(state, eqxopt.FromOptaxState)
        state.inner_state[0].mu["w"]  # Optax's own ScaleByAdamState, as a field
        ```
    """

    inner_state: PyTree[Any]


class FromOptax(AbstractOptimizer[FromOptaxState]):
    """An Optax gradient transformation as an eqxopt optimizer; built by
    [`eqxopt.from_optax`][].

    - Only inexact-array leaves of `params` and `grads` reach Optax (every other leaf is
      replaced by `None`), so `init` works on an unfiltered `eqx.Module`.
    - Optax runs under `jax.numpy_dtype_promotion("standard")`: Optax 0.2.8 relies on
      implicit promotion and fails under `"strict"`.
    - Updates are cast to their params' dtypes (API rule 4; to the grads' dtypes when
      no params are given).
    - Weak types are dropped from Optax's state (each array keeps its dtype): a state
      built from Python numbers, as `optax.lbfgs`'s line-search info, would otherwise
      change type at its first update, so that a `jit`-ed step compiled twice and the
      state could not be a loop carry.
    - Like every eqxopt optimizer, the state is checked for drift: an Optax state whose
      dtypes change during `update` raises [`eqxopt.StateDriftError`][]. This catches
      Optax's own drifts, e.g. `optax.adam`'s moments turning bfloat16 -> float32 when
      float32 grads meet bfloat16 params (use `eqxopt.Adam` there, or set
      `EQXOPT_CHECK_STATE=0`).
    - `hyperparams(state)` returns the `hyperparams` dict of an
      `optax.inject_hyperparams` state, and `{}` otherwise.

    !!! Example

        ```python
        import jax.numpy as jnp
        import optax

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.from_optax(optax.sgd(0.1, momentum=0.9))
        assert isinstance(opt, eqxopt.FromOptax)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    tx: Any = eqx.field(static=True)

    def init(self, params: Params) -> FromOptaxState:
        with jax.numpy_dtype_promotion("standard"):
            return FromOptaxState(_strong_arrays(self.tx.init(_only_params(params))))

    def update(
        self,
        grads: Updates,
        state: FromOptaxState,
        params: Params | None = None,
        **extra,
    ) -> tuple[Updates, FromOptaxState]:
        grads = _only_params(grads)
        params = None if params is None else _only_params(params)
        if callable(extra.get("value_fn")):
            extra["value_fn"] = _naming_extra_args(extra["value_fn"], extra)
        with jax.numpy_dtype_promotion("standard"):
            updates, inner_state = self.tx.update(
                grads, state.inner_state, params, **extra
            )
        updates = tree_map(
            lambda u, g, p: u.astype(out_dtype(g, p)),
            updates,
            grads,
            params,
            names=("updates", "grads", "params"),
        )
        return updates, FromOptaxState(_strong_arrays(inner_state))

    def hyperparams(self, state: FromOptaxState) -> dict[str, Any]:
        found = getattr(state.inner_state, "hyperparams", None)
        return dict(found) if isinstance(found, dict) else {}


def _strong_arrays(tree):
    return jax.tree.map(lambda x: strong(x) if eqx.is_array(x) else x, tree)


def _only_params(tree):
    return jax.tree.map(
        lambda x: x if is_param(x) else None, tree, is_leaf=lambda x: x is None
    )


# The extra arguments that Optax's line searches take themselves.
_LINESEARCH_ARGS = frozenset({"value", "grad", "value_fn"})


def _naming_extra_args(value_fn, extra):
    """`value_fn`, with a signature that also names every other extra argument of the
    update (dropped when passed).

    Optax's line searches (`optax.lbfgs`'s zoom, `scale_by_backtracking_linesearch`)
    pass `value_fn` the extra arguments its signature names and reject any other as
    "not consumed by `value_fn`", while eqxopt forwards every extra argument to every
    child, to be ignored where unused (design.md#protocol): `eqxopt.minimize` also
    passes Optax's `obj_fn=` and `grad_fn=`, for Sophia and SAM. Named here, they are
    dropped at `value_fn`, and the arguments `value_fn` itself takes still reach it.
    """
    try:
        parameters = inspect.signature(value_fn).parameters
    except (TypeError, ValueError):
        return value_fn
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return value_fn
    own = [p for p in parameters.values() if p.kind is not p.VAR_POSITIONAL]
    names = {p.name for p in own}
    others = sorted(set(extra) - _LINESEARCH_ARGS - names)
    if not others:
        return value_fn

    def named(*args, **kwargs):
        return value_fn(*args, **{k: v for k, v in kwargs.items() if k in names})

    keyword = inspect.Parameter.KEYWORD_ONLY
    named.__signature__ = inspect.Signature(  # pyright: ignore[reportFunctionMemberAccess]
        [*parameters.values(), *(inspect.Parameter(n, keyword) for n in others)]
    )
    return named


def _accepted_extra_args_only(optax, tx):
    """`tx`, with an `update` that forwards each extra argument only if `tx.update`
    accepts it (by name, or through `**kwargs`).

    `GradientTransformationExtraArgs` is a promise that `update` takes extra keyword
    arguments, but some of Optax's keep it only for the ones they use: e.g.
    `optax.contrib.sam`'s `update(updates, state, params, *, grad_fn=None)`, which
    would fail on the `value=` a `Chain` forwards to every child. Optax's own
    combinators pass a transformation only what it accepts.
    """
    try:
        parameters = list(inspect.signature(tx.update).parameters.values())
    except (TypeError, ValueError):  # no signature to read: forward everything
        return tx
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return tx
    # After `updates, state, params`, the keyword arguments it names.
    accepted = frozenset(
        p.name
        for p in parameters[3:]
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )
    inner_update = tx.update

    def update(updates, state, params=None, **extra):
        kept = {k: v for k, v in extra.items() if k in accepted}
        return inner_update(updates, state, params, **kept)

    return optax.GradientTransformationExtraArgs(tx.init, update)


def from_optax(tx: Any) -> AbstractOptimizer:
    """Use an Optax gradient transformation as an eqxopt optimizer.

    `tx` is an `optax.GradientTransformation` (with or without extra-args support) or
    an object with `init` and `update` methods such as `optax.MultiSteps`. Returns a
    [`eqxopt.FromOptax`][] whose state, a [`eqxopt.FromOptaxState`][], wraps Optax's
    and is checked for drift like any other eqxopt state; extra `update` arguments
    are forwarded to transformations that accept them. `from_optax(eqxopt.to_optax(
    opt))` returns `opt` itself.

    !!! Example

        ```python
        import jax.numpy as jnp
        import optax

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.from_optax(optax.clip_by_global_norm(1.0)), eqxopt.Adam(1e-3)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```

    Raises `ImportError` naming the `optax` extra when Optax is not installed.
    """
    optax = _import_optax("from_optax")
    origin = getattr(getattr(tx, "update", None), _ORIGIN, None)
    if isinstance(origin, AbstractOptimizer):
        return origin
    if isinstance(tx, AbstractOptimizer):
        raise TypeError(
            "`eqxopt.from_optax(tx)` takes an Optax gradient transformation, but was "
            f"given the eqxopt optimizer {type(tx).__name__}; use it directly."
        )
    if isinstance(tx, optax.GradientTransformation):
        tx = optax.with_extra_args_support(tx)
        tx = _accepted_extra_args_only(optax, tx)
    elif callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None)):
        # E.g. `optax.MultiSteps`, whose `update` takes extra arguments.
        tx = optax.GradientTransformationExtraArgs(tx.init, tx.update)
        tx = _accepted_extra_args_only(optax, tx)
    else:
        raise TypeError(
            "`eqxopt.from_optax(tx)` takes an `optax.GradientTransformation` (or an "
            f"object with `init` and `update` methods), got {type(tx).__name__}."
        )
    return FromOptax(tx)
