"""`ApplyIfFinite`: skip the inner optimizer on a step whose grads are not finite,
and give up after `max_consecutive_errors` such steps in a row."""

from typing import Any

import equinox as eqx
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Bool, Int32

from .._core.base import (
    AbstractOptimizer,
    check_optimizer,
    child_update,
    scalar_hyperparams,
)
from .._custom_types import Params, Updates
from .._misc import (
    increment,
    is_param,
    typechecked,
    zero_count,
)
from .base import like_zero_updates, zero_updates


def skip_or_apply(apply: Array, fn, grads, params, state, wrapper: str):
    """`lax.cond(apply, fn, skip, state)`, where `fn(state)` returns `(updates,
    new_state)` and `skip` returns zero updates and `state` unchanged.

    The state is selected whole by control flow, never blended arithmetically, so
    bools stay bools and a NaN inside the skipped branch cannot reach the result.
    """

    def _apply(state):
        updates, state = fn(state)
        return like_zero_updates(updates, zero_updates(grads, params), wrapper), state

    def _skip(state):
        return zero_updates(grads, params), state

    return lax.cond(apply, _apply, _skip, state)


# --- ZeroNans ----------------------------------------------------------------------


# --- ApplyIfFinite -----------------------------------------------------------------


@typechecked
class ApplyIfFiniteState(eqx.Module):
    """State of [`eqxopt.ApplyIfFinite`][].

    - `notfinite_count`: consecutive updates with a NaN or inf in the grads (reset to 0
        by a finite one).
    - `last_finite`: whether the grads of the last update were all finite.
    - `total_notfinite`: every update with non-finite grads so far (never reset).
    - `inner_state`: the wrapped optimizer's state.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.ApplyIfFinite(eqxopt.Adam(1e-3), 5).init(params)
        state.notfinite_count  # non-finite updates in a row (int32)
        state.total_notfinite  # non-finite updates so far (int32)
        assert isinstance(state.inner_state, eqxopt.AdamState)
        ```
    """

    notfinite_count: Int32[Array, ""]
    last_finite: Bool[Array, ""]
    total_notfinite: Int32[Array, ""]
    inner_state: Any


def all_finite(tree) -> Bool[Array, ""]:
    """Whether every optimised leaf of `tree` is free of NaN and inf."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jtu.tree_leaves(tree) if is_param(x)]
    if not leaves:
        return jnp.ones((), jnp.bool_)
    return jnp.all(jnp.stack(leaves))


class ApplyIfFinite(AbstractOptimizer[ApplyIfFiniteState]):
    r"""Skip the wrapped optimizer when the grads contain a NaN or an inf.

    On a non-finite step the updates are zero and the inner state is left exactly as
    it was (selected whole with `lax.cond`, never blended). After more than
    `max_consecutive_errors` consecutive non-finite steps the update is let through,
    as Optax does. Matches `optax.apply_if_finite`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.ApplyIfFinite(eqxopt.Adam(1e-3), max_consecutive_errors=5)
        state = opt.init(params)
        bad = {"w": jnp.full((2, 3), jnp.nan), "b": grads["b"]}
        new_params, state = opt.step(params, bad, state)  # skipped: params unchanged
        assert state.total_notfinite == 1 and jnp.all(new_params["w"] == params["w"])
        ```
    """

    optimizer: AbstractOptimizer
    max_consecutive_errors: int

    def __check_init__(self):
        check_optimizer("ApplyIfFinite", "optimizer", self.optimizer)
        n = self.max_consecutive_errors
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(
                "`ApplyIfFinite(max_consecutive_errors=...)` must be an integer >= 0, "
                f"got {n!r}."
            )

    def init(self, params: Params) -> ApplyIfFiniteState:
        return ApplyIfFiniteState(
            notfinite_count=zero_count(),
            last_finite=jnp.ones((), jnp.bool_),
            total_notfinite=zero_count(),
            inner_state=self.optimizer.init(params),
        )

    def update(self, grads: Updates, state: ApplyIfFiniteState, params=None, **extra):
        finite = all_finite(grads)
        notfinite_count = jnp.where(
            finite, zero_count(), increment(state.notfinite_count)
        )
        apply = finite | (notfinite_count > self.max_consecutive_errors)

        def _apply(inner_state):
            return child_update(
                self.optimizer, ".inner_state", grads, inner_state, params, **extra
            )

        updates, inner_state = skip_or_apply(
            apply, _apply, grads, params, state.inner_state, "ApplyIfFinite"
        )
        total = jnp.where(
            finite, state.total_notfinite, increment(state.total_notfinite)
        )
        return updates, ApplyIfFiniteState(notfinite_count, finite, total, inner_state)

    def hyperparams(self, state: ApplyIfFiniteState) -> dict[str, Any]:
        out = scalar_hyperparams(self, None)
        out["optimizer"] = self.optimizer.hyperparams(state.inner_state)
        return out


ApplyIfFinite.__init__.__doc__ = """**Arguments:**

- `optimizer`: the optimizer to protect.
- `max_consecutive_errors`: how many consecutive non-finite updates to skip; the next
    one is applied.
"""
