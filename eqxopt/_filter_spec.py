"""The one filter-spec resolver: masks and labels as in `eqx.partition` (a PyTree prefix
of the params whose leaves are values, or callables applied to each param leaf), and
the selections built from them (`Masked`, `Partition`, weight-decay masks, Muon's and
Kron's routing)."""

from typing import Any

import equinox as eqx
import jax.tree_util as jtu

from ._custom_types import FilterSpec, Params
from ._misc import (
    is_none,
    resolve_filter_spec,
)


def decay_mask(mask: FilterSpec | None, params: Params):
    """A tree of bools (one per param leaf) from a weight-decay filter spec."""
    if mask is None:
        return None
    return resolve_filter_spec(mask, params, what="weight-decay `mask`", bools=True)


def is_callable_spec(x) -> bool:
    return callable(x) and not isinstance(x, eqx.Module)


def path_values(tree) -> list[tuple[str, Any]]:
    leaves = jtu.tree_flatten_with_path(tree, is_leaf=is_none)[0]
    return [(jtu.keystr(path), v) for path, v in leaves]


def resolve_mask(mask: FilterSpec, params, *, what: str):
    """The mask as a tree of Python bools (one per optimised leaf, `None` elsewhere)."""
    return resolve_filter_spec(mask, params, what=what, bools=True)


# Muon's routing resolves its `matrix_mask` like any other filter spec.
resolve_spec = resolve_filter_spec


def select(tree, mask, keep: bool = True):
    """The leaves of `tree` where `mask` is `keep`, `None` elsewhere."""
    return jtu.tree_map(
        lambda x, m: x if m is keep else None, tree, mask, is_leaf=is_none
    )
