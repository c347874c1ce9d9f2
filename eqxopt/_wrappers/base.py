"""Helpers shared by the wrappers that sometimes skip their inner optimizer
(`MultiSteps`, `ApplyIfFinite`): zero updates shaped like the ones the inner optimizer
would have returned."""

import jax.numpy as jnp
import jax.tree_util as jtu

from .._misc import (
    is_none,
    out_dtype,
    sharded_like,
    tree_map,
    zeros_like_leaf,
)


def zero_updates(grads, params):
    """Zero updates: one per optimised leaf of `grads`, in the param's dtype (API rule
    4; the grad's without `params`), `None` at every other leaf."""
    return tree_map(
        lambda g, p: zeros_like_leaf(g, out_dtype(g, p)),
        grads,
        params,
        names=("grads", "params"),
    )


def like_zero_updates(updates, zeros, wrapper: str):
    """The wrapped optimizer's `updates`, checked against (and cast to the dtypes and
    sharding types of) the zero updates a wrapper returns when it skips, so that both
    `lax.cond` branches have the same types. Leaves that are not optimised map to
    `None`."""
    if jtu.tree_structure(updates, is_leaf=is_none) != jtu.tree_structure(
        zeros, is_leaf=is_none
    ):
        raise ValueError(
            f"`{wrapper}`: the wrapped optimizer returned updates whose tree structure "
            "differs from the grads': "
            f"{jtu.tree_structure(updates, is_leaf=is_none)} vs "
            f"{jtu.tree_structure(zeros, is_leaf=is_none)}."
        )

    def _leaf(u, z):
        if z is None:
            return None
        if u is None or jnp.shape(u) != z.shape:
            raise ValueError(
                f"`{wrapper}`: the wrapped optimizer returned an update of shape "
                f"{None if u is None else jnp.shape(u)} for a param leaf of shape "
                f"{z.shape}."
            )
        return sharded_like(u.astype(z.dtype), z)

    return jtu.tree_map(_leaf, updates, zeros, is_leaf=is_none)
