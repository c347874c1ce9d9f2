"""`Masked`: apply an optimizer to the leaves a mask (an Equinox filter spec) selects;
the others pass their incoming updates through unchanged."""

from typing import Any

import equinox as eqx
import jax.tree_util as jtu

from .._core.base import AbstractOptimizer, check_optimizer, child_update
from .._custom_types import FilterSpec, Params, Updates
from .._filter_spec import resolve_mask, select
from .._misc import (
    is_none,
    is_param,
    mask_field,
    out_dtype,
    tree_map,
    typechecked,
)


# --- Masked ------------------------------------------------------------------------


@typechecked
class MaskedState(eqx.Module):
    """State of [`eqxopt.Masked`][]: the wrapped optimizer's state, which holds buffers
    for the masked-in leaves only (`None` at the others).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        opt = eqxopt.Masked(eqxopt.Adam(1e-3), mask=lambda p: p.ndim == 2)
        state = opt.init(params)
        assert state.inner_state.mu["w"].shape == (2, 3)
        assert state.inner_state.mu["b"] is None  # no buffer for an unmasked leaf
        ```
    """

    inner_state: Any


class Masked(AbstractOptimizer[MaskedState]):
    """Apply `optimizer` to the leaves `mask` selects; every other leaf's incoming
    update passes through unchanged (cast to the param's dtype, as every update is).

    `mask` is a filter spec, as for `eqx.partition`: a PyTree prefix of the params with
    bool leaves (`{"encoder": True, "head": False}`), a callable applied to each param
    leaf (`lambda p: p.ndim == 2`), or a tree mixing both. An `eqx.Module` is a tree,
    never called (so a model-shaped Module of bools works; in Optax it is called as a
    function: optax#1373). Masks are static: their leaves must be Python bools.

    The inner optimizer sees only the masked-in leaves (the others are `None`), so its
    state holds buffers for those only. Passing masked-out leaves through is Optax's
    convention, so a [`eqxopt.Chain`][] of `Masked` over disjoint groups equals a
    [`eqxopt.Partition`][]. Matches `optax.masked`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Masked(eqxopt.Adam(1e-3), mask=lambda p: p.ndim == 2)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # Adam on the matrix "w"; the grads of "b" pass through unchanged
        ```
    """

    optimizer: AbstractOptimizer
    mask: FilterSpec = mask_field()

    def __check_init__(self):
        check_optimizer("Masked", "optimizer", self.optimizer)

    def _mask(self, tree):
        return resolve_mask(self.mask, tree, what="`Masked` mask")

    def init(self, params: Params) -> MaskedState:
        mask = self._mask(params)
        return MaskedState(self.optimizer.init(select(params, mask)))

    def update(self, grads: Updates, state: MaskedState, params=None, **extra):
        mask = self._mask(grads if params is None else params)
        tree_map(lambda g, m: g, grads, mask, names=("grads", "mask"))  # structure
        inner_params = None if params is None else select(params, mask)
        inner_updates, inner_state = child_update(
            self.optimizer,
            ".inner_state",
            select(grads, mask),
            state.inner_state,
            inner_params,
            **extra,
        )
        if params is None:
            params = jtu.tree_map(lambda _: None, grads, is_leaf=is_none)

        def _leaf(g, u, m, p):
            if m is True:
                return u
            if is_param(g):  # passed through, in the param's dtype (API rule 4)
                return g.astype(out_dtype(g, p if is_param(p) else None))
            return g

        updates = jtu.tree_map(
            _leaf, grads, inner_updates, mask, params, is_leaf=is_none
        )
        return updates, MaskedState(inner_state)

    def hyperparams(self, state: MaskedState) -> dict[str, Any]:
        return {"optimizer": self.optimizer.hyperparams(state.inner_state)}


Masked.__init__.__doc__ = """**Arguments:**

- `optimizer`: the optimizer to apply to the selected leaves.
- `mask`: which leaves, as a filter spec: a PyTree prefix of the params with bool
    leaves, or per-leaf callables returning bools.
"""


# --- Partition ---------------------------------------------------------------------
