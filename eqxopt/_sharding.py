"""The shardings of an optimizer's state, from those of its params."""

import math
from collections.abc import Sequence

import jax
import jax.tree_util as jtu
import numpy as np
from jax.sharding import (
    AbstractMesh,
    AxisType,
    Mesh,
    NamedSharding,
    PartitionSpec,
    Sharding,
)
from jaxtyping import PyTree

from ._core.base import AbstractOptimizer
from ._custom_types import Params
from ._quantized import block_sharding, is_quantized


def _is_array_like(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, jax.ShapeDtypeStruct))


def _is_none(x) -> bool:
    return x is None


def state_shardings(
    opt: AbstractOptimizer,
    params: Params,
    shardings: PyTree[Sharding] | Sharding | None = None,
    *,
    shard_over: str | Sequence[str] | None = None,
) -> PyTree[Sharding | None]:
    """The shardings of `opt.init(params)`'s leaves, without computing the state.

    Use it as `jax.jit(opt.init, out_shardings=...)`, as the `out_shardings` of a
    training step, or to build the abstract target a sharded checkpoint is restored
    into (`jax.ShapeDtypeStruct(shape, dtype, sharding=...)`).

    A state leaf that mirrors a param (moments, momentum, accumulators: its path in
    the state ends with the param's path and it has the param's shape) gets that
    param's sharding. Any other leaf gets the sharding JAX's sharding-in-types rules
    give it when `opt.init` is traced abstractly (`jax.eval_shape`) over the mesh with
    `Explicit` axes, whatever the axis types of your mesh: e.g. a stack of buffers,
    `(m, *shape)`, is sharded like its param along the trailing axes, while counters,
    flags and other leaves that do not depend on the params are replicated over the
    mesh. (If that trace fails, for an `init` whose sharding is ambiguous such as a
    matmul over a sharded axis, those other leaves are replicated.) The codes and
    scales of a quantized buffer ([`eqxopt.QuantizedArray`][]) are split along their
    leading, per-block axis over the mesh axes that split the param's first dimension,
    when that is the param's only sharded dimension and each shard holds whole blocks;
    otherwise they are replicated. (`opt.init` places them so eagerly; under `jit`,
    pass these shardings as its `out_shardings`.)

    **Arguments:**

    - `opt`: the optimizer.
    - `params`: the params, as arrays or `jax.ShapeDtypeStruct`s (e.g. from
        `jax.eval_shape`); any other leaf is ignored, as by `opt.init`.
    - `shardings`: the params' shardings, as a PyTree with the structure of `params`
        or one `Sharding` for every leaf. Default: each leaf's own `.sharding`.
    - `shard_over`: a mesh axis name, or a tuple of names, to split the state over
        (ZeRO stage 1: params and gradients replicated over a data-parallel axis, the
        optimizer state split over it). Every state leaf that mirrors a param is
        additionally sharded over these axes, on the first of its dimensions that
        the param's sharding leaves unsharded and that the axes' total size divides
        (a tuple splits that one dimension over the product of its axes; axes the
        param is already sharded over are left out). A leaf none of whose
        dimensions qualifies (a scalar, a bias of 3 on 8 devices) keeps the param's
        sharding; leaves that do not mirror a param (counters, factor matrices) are
        not split. Default: `None`, the state is sharded like the params.

    **Returns:**

    A PyTree with the structure of the state, holding a `jax.sharding.Sharding` for
    every array leaf (a `NamedSharding` on the params' mesh when the params are
    sharded over a mesh).

    **Raises:**

    `ValueError` if `shard_over` names an axis the params' mesh lacks, or if it is
    given for params that are not on a mesh.

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P

        import eqxopt

        mesh = jax.make_mesh((len(jax.devices()),), ("model",))
        w = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("model")))
        opt, params = eqxopt.Adam(1e-3), {"w": w}
        state = jax.jit(opt.init, out_shardings=eqxopt.state_shardings(opt, params))(
            params
        )
        assert state.mu["w"].sharding == params["w"].sharding
        ```

        ZeRO stage 1: replicated params, and the state split over the devices.

        ```python
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P

        import eqxopt

        opt = eqxopt.Adam(1e-3)
        n = len(jax.devices())
        mesh = jax.make_mesh((n,), ("data",))
        params = {"w": jax.device_put(jnp.ones((4, 2 * n)), NamedSharding(mesh, P()))}
        shardings = eqxopt.state_shardings(opt, params, shard_over="data")
        state = jax.jit(opt.init, out_shardings=shardings)(params)
        # Each device holds 8 of the moment's 8n entries (on 8 devices: P(None, "data"),
        # as 4 rows do not split 8 ways).
        assert state.mu["w"].addressable_shards[0].data.size == 8
        ```
    """
    abstract, found = _shardings(opt, params, shardings, shard_over)
    if found is None:
        raise ValueError(
            "`eqxopt.state_shardings`: cannot tell the params' shardings. Pass params "
            "that are arrays or `jax.ShapeDtypeStruct`s with a `sharding`, all "
            "`NamedSharding`s on one mesh (or all on one device), or pass `shardings=`."
        )
    return found


def abstract_state(
    opt: AbstractOptimizer,
    params: Params,
    shardings: PyTree[Sharding] | Sharding | None = None,
    *,
    shard_over: str | Sequence[str] | None = None,
) -> PyTree[jax.ShapeDtypeStruct]:
    """`opt.init(params)` as `jax.ShapeDtypeStruct`s (shape, dtype and the sharding
    [`eqxopt.state_shardings`][] gives), without computing or allocating anything: the
    target to restore a checkpoint into.

    Takes the same arguments as [`eqxopt.state_shardings`][]; when the params carry
    no shardings and none are given, the structs have no sharding.

    !!! Example

        ```python
        import equinox as eqx
        import jax

        import eqxopt

        opt = eqxopt.AdamW(1e-3)
        model = eqx.filter_eval_shape(eqx.nn.Linear, 3, 4, key=jax.random.key(0))
        target = eqxopt.abstract_state(opt, model)  # no arrays allocated
        assert target.mu.weight.shape == (4, 3)
        ```
    """
    abstract, found = _shardings(opt, params, shardings, shard_over)
    if found is None:
        return abstract
    return jtu.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, found
    )


def _shardings(opt, params, shardings, shard_over=None):
    """`(abstract state, its shardings or None when the params carry none)`."""
    over = _shard_over_axes(shard_over)
    leaves, treedef = jtu.tree_flatten(params, is_leaf=_is_none)
    if shardings is None:
        given = [getattr(x, "sharding", None) for x in leaves]
    elif isinstance(shardings, Sharding):
        given = [shardings] * len(leaves)
    else:
        try:
            given = treedef.flatten_up_to(shardings)
        except (ValueError, TypeError) as e:
            raise ValueError(
                "`eqxopt.state_shardings(opt, params, shardings)`: `shardings` must be "
                "one `Sharding` or a PyTree with the structure of `params`."
            ) from e
    arrays = [
        (x, s) for x, s in zip(leaves, given) if _is_array_like(x) and _inexact(x)
    ]
    named = [s for _, s in arrays if isinstance(s, NamedSharding)]
    abstract_state = _abstract_init(opt, params, treedef, leaves, None)

    if not named:
        distinct = {s for _, s in arrays}
        if len(distinct) != 1 or None in distinct:
            return abstract_state, None
        if over:
            raise ValueError(
                f"`eqxopt.state_shardings(..., shard_over={shard_over!r})`: the "
                "params are not sharded over a mesh, so there is no axis to split the "
                "state over. Place the params with `NamedSharding`s on a mesh that "
                f"has the axis {over[0]!r} (or pass such `shardings=`)."
            )
        (only,) = distinct
        return abstract_state, jtu.tree_map(lambda _: only, abstract_state)

    mesh = named[0].mesh
    for s in named[1:]:
        if not _same_mesh(s.mesh, mesh):
            raise ValueError(
                "`eqxopt.state_shardings`: the params are sharded over different "
                f"meshes ({mesh} and {s.mesh}); shard them over one mesh."
            )
    for name in over:
        if name not in mesh.axis_names:
            raise ValueError(
                f"`eqxopt.state_shardings(..., shard_over={shard_over!r})`: the "
                f"params' mesh has no axis {name!r} (its axes: "
                f"{', '.join(map(repr, mesh.axis_names))}). Name one of those axes."
            )

    def spec_of(s) -> PartitionSpec:
        return s.spec if isinstance(s, NamedSharding) else PartitionSpec()

    specs = [
        spec_of(s) if _is_array_like(x) and _inexact(x) else None
        for x, s in zip(leaves, given)
    ]
    try:
        traced = _explicit_specs(opt, params, treedef, leaves, specs, mesh)
    except Exception:  # an `init` the sharding-in-types rules cannot type
        traced = None
    # A leaf mirroring a param gets that param's own sharding (same spec spelling,
    # same memory kind), even if `init` built it replicated. Other leaves get their
    # traced sharding; without a trace (fallback) they are replicated.
    mirrored = _mirrored(params, leaves, given, abstract_state)
    state_treedef = jtu.tree_structure(abstract_state)
    traced_specs = (
        [None] * len(mirrored)
        if traced is None
        else state_treedef.flatten_up_to(traced)
    )
    chosen = []
    for spec, param_sharding, leaf in zip(
        traced_specs, mirrored, jtu.tree_leaves(abstract_state)
    ):
        if param_sharding is not None:
            chosen.append(_split(param_sharding, leaf.shape, over))
        else:
            spec = PartitionSpec() if spec is None else spec
            chosen.append(NamedSharding(mesh, spec))
    return abstract_state, jtu.tree_unflatten(state_treedef, chosen)


def _same_mesh(a: Mesh | AbstractMesh, b: Mesh | AbstractMesh) -> bool:
    """Whether two meshes have the same axis names and the same devices in the same
    layout. (An `AbstractMesh` has no devices: JAX raises when they are asked for.)"""
    return (
        a.axis_names == b.axis_names
        and np.shape(np.asarray(a.devices)) == np.shape(np.asarray(b.devices))
        and np.array_equal(np.asarray(a.device_ids), np.asarray(b.device_ids))
    )


def _inexact(x) -> bool:
    return np.issubdtype(np.dtype(x.dtype), np.inexact)


def _abstract_init(opt, params, treedef, leaves, make_leaf):
    """`jax.eval_shape(opt.init, params)`, over the array-like leaves of `params`."""
    dynamic = [
        (
            (make_leaf(i, x) if make_leaf else jax.ShapeDtypeStruct(x.shape, x.dtype))
            if _is_array_like(x)
            else None
        )
        for i, x in enumerate(leaves)
    ]
    static = [None if _is_array_like(x) else x for x in leaves]

    def init(dynamic):
        full = [d if s is None else s for d, s in zip(dynamic, static)]
        return opt.init(jtu.tree_unflatten(treedef, full))

    return jax.eval_shape(init, dynamic)


def _explicit_specs(opt, params, treedef, leaves, specs, mesh):
    """The PartitionSpec of every state leaf, from an abstract trace of `opt.init` with
    sharding in types (every mesh axis `Explicit`)."""
    abstract_mesh = mesh.abstract_mesh
    explicit = abstract_mesh.update_axis_types(
        {name: AxisType.Explicit for name in abstract_mesh.axis_names}
    )

    def make_leaf(i, x):
        spec = specs[i] if specs[i] is not None else PartitionSpec()
        return jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=NamedSharding(explicit, spec)
        )

    with jax.sharding.use_abstract_mesh(explicit):
        out = _abstract_init(opt, params, treedef, leaves, make_leaf)

    def spec(leaf) -> PartitionSpec:
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding):
            return _canonical(sharding.spec)
        return PartitionSpec()

    return jtu.tree_map(spec, out)


def _canonical(spec: PartitionSpec) -> PartitionSpec:
    """The per-axis partitioning of `spec` without trailing `None`s (`P()`, not
    `P(None,)`); unreduced/reduced axes are dropped."""
    axes = list(spec)
    while axes and axes[-1] is None:
        axes.pop()
    return PartitionSpec(*axes)


def _mirrored(params, leaves, given, abstract_state) -> list:
    """For each state leaf (flattened order): the sharding of the param it mirrors
    (its path ends with the param's path and it has the param's shape; the longest
    such path wins), or `None`. The codes and scales of a quantized buffer
    (`eqxopt.QuantizedArray`) that mirrors a param get `block_sharding`'s."""
    flat = jtu.tree_flatten_with_path(params, is_leaf=_is_none)[0]
    known = [
        (jtu.keystr(path), tuple(x.shape), s)
        for (path, x), s in zip(flat, given)
        if _is_array_like(x) and _inexact(x) and isinstance(s, NamedSharding)
    ]
    out = []
    nodes = jtu.tree_flatten_with_path(abstract_state, is_leaf=is_quantized)[0]
    for path, node in nodes:
        where, best = jtu.keystr(path), None
        for p_path, shape, s in known:
            if where.endswith(p_path) and tuple(node.shape) == shape:
                if best is None or len(p_path) > len(best[0]):
                    best = (p_path, s)
        if not is_quantized(node):
            out.append(None if best is None else best[1])
        elif best is None:
            out.extend([None] * len(jtu.tree_leaves(node)))
        else:
            placed = block_sharding(best[1], tuple(node.shape), node.block_size)
            out.extend([placed] * len(jtu.tree_leaves(node)))
    return out


def _shard_over_axes(shard_over) -> tuple[str, ...]:
    """`shard_over` as a tuple of axis names (empty for `None`)."""
    if shard_over is None:
        return ()
    if isinstance(shard_over, str):
        names = (shard_over,)
    elif isinstance(shard_over, Sequence):
        names = tuple(shard_over)
    else:
        names = ()
    if (
        not names
        or not all(isinstance(n, str) for n in names)
        or len(set(names)) != len(names)
    ):
        raise ValueError(
            "`eqxopt.state_shardings(..., shard_over=...)` must be a mesh axis name "
            'or a tuple of distinct names (e.g. `shard_over="data"`), or `None`; '
            f"got {shard_over!r}."
        )
    return names


def _split(sharding: NamedSharding, shape, over: tuple[str, ...]) -> NamedSharding:
    """`sharding`, additionally split over the axes `over` (those it does not use
    already) along the first dimension of `shape` that it leaves unsharded and that
    their product divides; `sharding` itself when no dimension qualifies."""
    spec = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
    used = set()
    for entry in spec:
        used.update((entry,) if isinstance(entry, str) else entry or ())
    axes = tuple(a for a in over if a not in used)
    if not axes:
        return sharding
    size = math.prod(sharding.mesh.shape[a] for a in axes)
    for i, (n, entry) in enumerate(zip(shape, spec)):
        if entry in (None, ()) and n % size == 0:
            spec[i] = axes[0] if len(axes) == 1 else axes
            return NamedSharding(
                sharding.mesh,
                _canonical(PartitionSpec(*spec)),
                memory_kind=sharding.memory_kind,
            )
    return sharding
