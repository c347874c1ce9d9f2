"""`Partition`: one optimizer per group of leaves, the groups given by labels (a
filter spec), as `optax.partition`."""

from collections.abc import Hashable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.tree_util as jtu
import numpy as np

from .._core.base import AbstractOptimizer, check_optimizer, child_update
from .._custom_types import FilterSpec, Params, Updates
from .._filter_spec import is_callable_spec, path_values, select
from .._misc import (
    is_none,
    mask_field,
    resolve_filter_spec,
    tree_map,
    typechecked,
)


@typechecked
class PartitionState(eqx.Module):
    """State of [`eqxopt.Partition`][]: one inner state per label, each holding
    buffers for that group's leaves only.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        opt = eqxopt.Partition(
            {"adam": eqxopt.Adam(1e-3), "sgd": eqxopt.SGD(1e-2)},
            labels=lambda p: "adam" if p.ndim == 2 else "sgd",
        )
        state = opt.init(params)
        assert state.inner_states["adam"].mu["b"] is None  # "b" is in the sgd group
        ```
    """

    inner_states: dict


def _check_label(label, where: str) -> None:
    if isinstance(label, (jax.Array, np.ndarray)) or not isinstance(label, Hashable):
        raise ValueError(
            f"eqxopt: `Partition` labels must be hashable values such as strings, but "
            f"{where} is {label!r}."
        )


class Partition(AbstractOptimizer[PartitionState]):
    """One optimizer per group of leaves: `labels` gives each param leaf a label, and
    `optimizers[label]` is applied to the leaves with that label.

    `labels` is a filter spec, as for `eqx.partition`: a PyTree prefix of the params
    whose leaves are labels (`{"encoder": "adam", "head": "sgd"}`), a callable applied
    to each param leaf (`lambda p: "muon" if p.ndim == 2 else "adam"`), or a tree
    mixing both; an `eqx.Module` is a tree, never called. To label by path, build the
    tree with `jax.tree_util.tree_map_with_path`.

    Every param leaf belongs to exactly one group: a leaf whose label has no optimizer,
    or an optimizer that gets no leaf, raises a `ValueError` (at construction when
    `labels` is a tree of labels, else at `init`). The state holds one inner state per
    label, and `hyperparams` one dict per label, so each group's current learning rate
    can be logged. Matches `optax.partition`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Partition(
            {"adam": eqxopt.Adam(1e-3), "sgd": eqxopt.SGD(1e-2)},
            labels=lambda p: "adam" if p.ndim == 2 else "sgd",
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    optimizers: dict
    labels: FilterSpec = mask_field()

    def __init__(self, optimizers: Mapping[Any, AbstractOptimizer], labels):
        if not isinstance(optimizers, Mapping) or not optimizers:
            raise ValueError(
                "`Partition(optimizers=...)` must be a non-empty dict mapping each "
                f"label to an optimizer, got {optimizers!r}."
            )
        for label, opt in optimizers.items():
            _check_label(label, f"the key {label!r} of `optimizers`")
            check_optimizer("Partition", f"optimizers[{label!r}]", opt)
        self.optimizers = dict(optimizers)
        self.labels = labels
        leaves = jtu.tree_leaves(labels, is_leaf=is_callable_spec)
        if not any(is_callable_spec(x) for x in leaves):
            self._check_labels({x for x in leaves}, where="`labels`")

    def _check_labels(self, used: set, where: str) -> None:
        for label in used:
            _check_label(label, f"a label in {where}")
        missing = [label for label in used if label not in self.optimizers]
        if missing:
            raise ValueError(
                f"eqxopt: `Partition` has no optimizer for the label(s) "
                f"{_names(missing)} used in {where}; its optimizers are labelled "
                f"{_names(self.optimizers)}. Every param leaf must belong to exactly "
                "one group."
            )
        unused = [label for label in self.optimizers if label not in used]
        if unused:
            raise ValueError(
                f"eqxopt: `Partition` optimizer(s) {_names(unused)} get no param leaf: "
                f"no leaf has that label in {where}. Remove them, or fix the labels."
            )

    def _labels(self, tree):
        labels = resolve_filter_spec(self.labels, tree, what="`Partition` labels")
        for path, label in path_values(labels):
            if label is None:
                continue
            _check_label(label, f"the label of `params{path}`")
        optimised = dict(path_values(tree_map(lambda p: p, tree)))
        for path, label in path_values(labels):
            if label is None and optimised.get(path) is not None:
                raise ValueError(
                    f"eqxopt: `Partition` labels give no label (None) to the param "
                    f"leaf `params{path}`; every param leaf must belong to a group."
                )
        used = {label for _, label in path_values(labels) if label is not None}
        self._check_labels(used, "the labels resolved against the params")
        return labels

    def init(self, params: Params) -> PartitionState:
        labels = self._labels(params)
        return PartitionState(
            {
                label: opt.init(select(params, _group(labels, label)))
                for label, opt in self.optimizers.items()
            }
        )

    def update(self, grads: Updates, state: PartitionState, params=None, **extra):
        labels = self._labels(grads if params is None else params)
        tree_map(lambda g, m: g, grads, labels, names=("grads", "labels"))  # structure
        updates = jtu.tree_map(lambda _: None, grads, is_leaf=is_none)
        new_states = {}
        for label, opt in self.optimizers.items():
            group = _group(labels, label)
            group_updates, new_states[label] = child_update(
                opt,
                f".inner_states[{label!r}]",
                select(grads, group),
                state.inner_states[label],
                None if params is None else select(params, group),
                **extra,
            )
            updates = jtu.tree_map(
                lambda u, new, m: new if m is True else u,
                updates,
                group_updates,
                group,
                is_leaf=is_none,
            )
        return updates, PartitionState(new_states)

    def hyperparams(self, state: PartitionState) -> dict[Any, Any]:
        return {
            label: opt.hyperparams(state.inner_states[label])
            for label, opt in self.optimizers.items()
        }


def _names(labels) -> str:
    return ", ".join(sorted(map(repr, labels)))


def _group(labels, label):
    """The mask of the leaves labelled `label` (`None` at non-param leaves)."""
    return jtu.tree_map(
        lambda l: None if l is None else bool(l == label), labels, is_leaf=is_none
    )


Partition.__init__.__doc__ = """**Arguments:**

- `optimizers`: a dict mapping each label to the optimizer for that group.
- `labels`: the label of each param leaf, as a filter spec: a PyTree prefix of the
    params with hashable labels, or per-leaf callables returning one.
"""
