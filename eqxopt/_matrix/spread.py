"""Spreading the matrix optimizers' per-matrix work over a mesh.

- [`find_spread`][], [`spread_map`][], [`map_stack`][]: the per-matrix work of
    different leaves, stacked by shape (one copy per shape in the compiled program;
    `vmap`-ed on accelerators, a `lax.map` loop on CPU) and split over the devices
    of the params' mesh (the `spread` option of SOAP, Shampoo, Kron, Muon and
    NorMuon);
- [`gathered`][], [`take`][]: what ops whose output sharding cannot be inferred need
    on `Explicit` mesh axes (with `eqxopt._misc.explicit_sharding`, re-exported
    here).
"""

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .._misc import explicit_sharding as explicit_sharding


def gathered(x: Array) -> Array:
    """`x` replicated over its mesh if it is sharded over `Explicit` mesh axes (see
    [`explicit_sharding`][]), else `x` unchanged (with `Auto` axes GSPMD decides)."""
    sharding = explicit_sharding(x)
    if sharding is None:
        return x
    whole = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return jax.sharding.reshard(x, whole)


def take(x: Array, indices: Array, axis: int) -> Array:
    """`jnp.take(x, indices, axis=axis)` for a permutation `indices`, keeping `x`'s
    sharding when it is sharded over `Explicit` mesh axes (where a gather along a
    sharded axis needs an output sharding). A permutation is in bounds, so indices
    are clipped rather than checked (`mode="clip"`: the same values, without the
    out-of-bounds test and select that the default `"fill"` compiles into every
    gather; SOAP's step at 10M params: 43,962 lines of optimized LLVM IR against
    49,625)."""
    sharding = explicit_sharding(x)
    if sharding is None:
        return jnp.take(x, indices, axis=axis, mode="clip")
    index = (slice(None),) * axis + (indices,)
    return x.at[index].get(mode="clip", out_sharding=sharding)


@dataclasses.dataclass(frozen=True)
class Spread:
    """Where [`spread_map`][] puts its stacks: the mesh (abstract, from the params'
    types) and the mesh axes whose devices share the stacked matrices."""

    mesh: Any
    axes: tuple[str, ...]

    @property
    def size(self) -> int:
        """The number of devices a stack is split over."""
        return math.prod(int(self.mesh.shape[a]) for a in self.axes)


def _to_axes(value):
    """A list of mesh axis names becomes a tuple (static fields must be hashable)."""
    return tuple(value) if isinstance(value, list) else value


def spread_field() -> Any:
    """The `spread` field of the matrix optimizers (static, default `True`)."""
    return eqx.field(default=True, static=True, converter=_to_axes)


def check_spread(opt, name: str = "spread") -> None:
    """Check a `spread` option at construction: a bool, a mesh axis name, or a tuple
    of distinct names. Raises a `ValueError` naming the field."""
    value = getattr(opt, name)
    if isinstance(value, bool):
        return
    names = (value,) if isinstance(value, str) else value
    if (
        not isinstance(names, tuple)
        or not names
        or not all(isinstance(a, str) for a in names)
        or len(set(names)) != len(names)
    ):
        raise ValueError(
            f"`{type(opt).__name__}({name}=...)` must be True, False, a mesh axis "
            f"name or a tuple of distinct mesh axis names, got {value!r}."
        )


def mesh_of(leaves: Sequence[Any]) -> Any:
    """The (abstract) mesh of the traced `leaves`: the one in their types
    (`jax.typeof(x).sharding.mesh`, present under `jit` whenever they are on a mesh,
    with `Auto` or `Explicit` axes), else the context mesh (`jax.set_mesh`); `None`
    outside a trace or without a mesh."""
    traced = [x for x in leaves if isinstance(x, jax.core.Tracer)]  # pyright: ignore
    if not traced:
        return None
    for x in traced:
        candidate = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
        if candidate is not None and candidate.axis_names:
            return candidate
    candidate = jax.sharding.get_abstract_mesh()
    return candidate if candidate.axis_names else None


def replicate(tree: Any, mesh: Any) -> Any:
    """Every array of `tree` replicated over the non-manual axes of `mesh` (from
    [`mesh_of`][]; `None` leaves `tree` alone): the sharding
    `eqxopt.state_shardings` predicts for factor matrices, which `init` builds
    unsharded. Under `jit` with `Auto` axes XLA would otherwise choose the outputs'
    shardings itself."""
    if mesh is None:
        return tree
    types = dict(zip(mesh.axis_names, mesh.axis_types))
    if all(t == jax.sharding.AxisType.Manual for t in types.values()):
        return tree
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    explicit = any(t == jax.sharding.AxisType.Explicit for t in types.values())

    def one(x):
        if not isinstance(x, jax.Array):
            return x
        if explicit:
            spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", None)
            if spec is None or all(a is None for a in spec):
                return x
            return jax.sharding.reshard(x, whole)
        return jax.lax.with_sharding_constraint(x, whole)

    return jax.tree.map(one, tree)


def find_spread(
    option: bool | str | tuple[str, ...], leaves: Sequence[Any], who: str
) -> Spread | None:
    """The [`Spread`][] an optimizer with `spread=option` uses for traced `leaves` (its
    grads/params), or `None` for "compute every matrix on every device".

    The mesh is the one in the leaves' types (`jax.typeof(x).sharding.mesh`, present
    under `jit` whenever the params are on a mesh, with `Auto` or `Explicit` axes),
    else the context mesh (`jax.set_mesh`). `option=True` uses every mesh axis that
    is not `Manual` (inside `shard_map` each device already has its own matrices);
    a name or tuple of names uses those axes. Nothing is spread outside a trace (eager
    op-by-op execution), over a mesh of one device, or with `option=False`.
    """
    if option is False:
        return None
    mesh = mesh_of(leaves)
    if mesh is None:
        return None
    manual = {
        a
        for a, t in zip(mesh.axis_names, mesh.axis_types)
        if t == jax.sharding.AxisType.Manual
    }
    if option is True:
        axes = tuple(a for a in mesh.axis_names if a not in manual)
    else:
        axes = (option,) if isinstance(option, str) else tuple(option)
        for a in axes:
            if a not in mesh.axis_names or a in manual:
                raise ValueError(
                    f"`{who}(spread={option!r})`: {a!r} is not a non-manual axis of "
                    f"the params' mesh, whose axes are {mesh.axis_names}."
                )
    axes = tuple(a for a in axes if int(mesh.shape[a]) > 1)
    return Spread(mesh, axes) if axes else None


def spread_map(
    fn: Callable,
    tasks: Sequence[tuple[Any, tuple[Array, ...]]],
    spread: Spread | None,
    *,
    shared: Any = (),
    batched: bool = False,
    group: bool = False,
    decomposition: bool = False,
    cheap: bool = False,
) -> list:
    """`[fn(static, shared, *operands) for static, operands in tasks]`, with the work
    of same-shape tasks stacked (one copy of `fn` per shape in the compiled program)
    and, with a `spread`, split over the devices of `spread`'s mesh axes.

    Tasks with the same `static` (hashable) and the same operand shapes and dtypes
    form a group. Each group of two or more tasks has its operands stacked along a
    new leading axis and `fn` mapped over the stack (see [`map_stack`][]: `jax.vmap`
    on accelerators, a `lax.map` loop on CPU), so the compiled program holds one copy
    of `fn` per group instead of one per task (a model's many same-shape matrices
    compile once). With a `spread`, every group's stack is padded (with copies of its
    first task) to a multiple of the number of devices and split over `spread.axes`,
    and under `jax.shard_map` each device maps `fn` over its own share of the tasks:
    no collective between the split and the results, so a data-dependent loop in
    `fn` stops on each device's own matrices. The results are then replicated
    (all-gathered) and unstacked, so each task's results are what `fn` gives it alone
    (up to the reassociation a batched kernel may do on accelerators).

    `shared` (a PyTree, e.g. hyperparameters) is passed to every call unbatched
    (replicated). `fn` must take every traced array it uses from its arguments, never
    from a closure: inside the `shard_map` a closed-over array of the outer trace
    would be every device's whole array, not its share.

    `batched=True` says that each operand already has a leading batch axis (of any
    size per task) and that `fn` maps over it itself (Muon's `(batch, m, n)`
    stacks): groups are concatenated along that axis instead of stacked, and `fn` is
    called on the concatenation. Without a `spread`, `batched=True` tasks are computed
    alone, or, with `group=True`, one call per concatenated group.

    `decomposition=True` says that `fn`'s cost is a QR or an `eigh`: stacks are then
    mapped by a loop on GPUs too (see [`batched_kernels`][]), and without a `spread`
    where that loop would be, the tasks are computed one by one, as `cheap` ones
    below: each decomposition is a library call whatever the shape, and a loop over
    a stack would only add the stacking copies and the per-task slices. SOAP's step
    on the 10M-param, 63-leaf tree compiled in 2.3 s instead of 2.9 s on CPU (and
    on a 243-leaf tree of the same size in 7.6 s instead of 8.5 s).

    `cheap=True` says that `fn` is a few matrix products and elementwise operations
    (no decomposition, loop or conditional): without a `spread`, where stacks are
    mapped by a loop (on CPU), the tasks are then computed one by one. There, the
    stacking copies, the loop and the slices of its results cost XLA more code
    generation than the copies of `fn`, whose kernels same-shape tasks share
    (XLA:CPU emits each distinct fusion once). On `benchmarks/compile_time.py`'s
    10M-param, 63-leaf tree, the whole step (trace, lowering and compile, medians of
    3) took 4.9 s for Kron (its preconditioning per task) against 5.2 s stacked, and
    3.0 s for SOAP (its momentum rotation) against 3.6 s.

    The results of stacked tasks are sliced out of the stacks by [`_opaque_offsets`][]
    (one kernel per stack, not one per task).
    """
    if spread is None and (
        (batched and not group)
        or ((cheap or decomposition) and not batched_kernels(decomposition))
    ):
        return [fn(static, shared, *operands) for static, operands in tasks]
    groups: dict[Any, list[int]] = {}
    for i, (static, operands) in enumerate(tasks):
        shapes = tuple((x.shape[1:] if batched else x.shape, x.dtype) for x in operands)
        groups.setdefault((static, shapes), []).append(i)
    results: list = [None] * len(tasks)
    stacked = []
    for (static, _), members in groups.items():
        if spread is None and len(members) == 1:
            (i,) = members
            results[i] = fn(static, shared, *tasks[i][1])
            continue
        n_ops = len(tasks[members[0]][1])
        join = jnp.concatenate if batched else jnp.stack
        stacks = [join([tasks[i][1][k] for i in members]) for k in range(n_ops)]
        sizes = [tasks[i][1][0].shape[0] if batched else 1 for i in members]
        call = functools.partial(fn, static)
        if not batched:
            call = map_stack(call, decomposition=decomposition)
        stacked.append((members, sizes, call, stacks))
    if spread is None:
        outs = [call(shared, *stacks) for _, _, call, stacks in stacked]
    else:
        # Every group in one `shard_map`, its results gathered at once.
        outs = _spread_call([(c, s) for _, _, c, s in stacked], shared, spread)
    for (members, sizes, _, _), out in zip(stacked, outs):
        starts = _opaque_offsets(list(itertools.accumulate(sizes, initial=0))[:-1], out)
        for i, size, start in zip(members, sizes, starts):
            if batched:
                one = lambda o: jax.lax.dynamic_slice_in_dim(o, start, size)
            else:
                one = lambda o: jax.lax.dynamic_index_in_dim(o, start, keepdims=False)
            results[i] = jax.tree.map(one, out)
    return results


def _opaque_offsets(offsets: list[int], out: Any) -> list[Any]:
    """`offsets` (where each task's results start in the stacks `out`) as int32
    scalars that XLA does not see as constants.

    XLA:CPU generates code once per distinct fusion, about 12 ms each. A slice at a
    constant offset is a fusion of its own for every offset: 121 of Shampoo's 306
    kernels at 10M params. A dynamic slice whose offset comes from outside the
    fusion is one kernel per stack shape. Each offset is therefore the first entry
    of a row of two copies of it, sorted (with every other row) by a key of two
    copies of a value of the stacks: the rows are constant, so any order gives the
    offsets back, but the sort (a kernel of its own, which XLA does not fold)
    depends on the stacks' values, so its results are buffers of their own."""
    probes = [o for o in jax.tree.leaves(out) if jnp.issubdtype(o.dtype, jnp.floating)]
    if len(offsets) < 2 or not probes:
        return [jnp.int32(k) for k in offsets]
    key = jnp.broadcast_to(probes[0].reshape(-1)[0], (2,))
    rows = tuple(jnp.full((2,), k, jnp.int32) for k in offsets)
    _, *ordered = jax.lax.sort((key, *rows), num_keys=1)
    return [row[0] for row in ordered]


def batched_kernels(decomposition: bool = False) -> bool:
    """Whether [`map_stack`][] maps with `jax.vmap` (one batched kernel per op: what
    accelerators want) rather than `lax.map` (a loop of unbatched ones): off CPU only.

    On CPU a batched LAPACK custom call (eigh, QR, Cholesky, triangular solve of a
    `vmap`-ed stack) splits its batch into chunks, schedules them on XLA's intra-op
    thread pool and blocks its thread until they finish (`ParallelBatchMap` in
    jaxlib's `jaxlib/cpu/lapack_kernels.cc`, waiting on an `absl::BlockingCounter`).
    XLA's CPU runtime runs the program's own thunks on that same pool, so a batched
    call issued from a pool thread can wait on tasks that no free thread is left to
    run. A run of `benchmarks/lm.py --quick` with stacks `vmap`-ed on CPU deadlocked
    on a 2-core machine (gdb: every thread waiting, one in `ParallelBatchMap`). An
    unbatched call runs its matrix on its own thread and schedules nothing; the
    batched kernel only loops over its matrices too (in `lm.py --quick`, SOAP's,
    Shampoo's and Kron's training times were unchanged).

    With `decomposition=True` (work whose cost is a QR or an `eigh`), GPUs loop too:
    there these are calls into the vendor's solver library (cuSOLVER), whose batched
    QR gains little on large matrices and loses much on mid-sized ones. On an H100
    (jax 0.11.2, float32), `vmap`-ed `jnp.linalg.qr` of 5 matrices took, per matrix,
    23.2 ms at 392x392 against 1.9 ms for one alone, and 5.7 and 8.0 ms at 1176 and
    1568 against 6.0 and 8.2 ms; SOAP's refresh at 10M params took 260 ms batched
    and 177 ms looped (`benchmarks/matrix.py`). TPUs, where QR and `eigh` are XLA's
    own batched algorithms, keep `vmap` (not measured).
    """
    backend = jax.default_backend()
    if decomposition:
        return backend not in ("cpu", "gpu")
    return backend != "cpu"


def map_stack(call: Callable, decomposition: bool = False) -> Callable:
    """`call(shared, *operands)` for one task, made into `mapped(shared, *stacks)`
    for a stack of tasks (operands stacked along a new leading axis, `shared` passed
    to every call): `jax.vmap` where [`batched_kernels`][], else `lax.map`, one
    unbatched call per task in a loop (one copy of `call` in the program either
    way). A data-dependent loop in `call` stops on each task's own matrix with
    `lax.map`, and when every task's has with `jax.vmap`.

    `decomposition=True` for a `call` whose cost is a QR or an `eigh` (see
    [`batched_kernels`][]).
    """
    vmap = batched_kernels(decomposition)

    def mapped(shared, *stacks):
        if vmap:
            axes = (None,) + (0,) * len(stacks)
            return jax.vmap(call, in_axes=axes)(shared, *stacks)
        return jax.lax.map(lambda operands: call(shared, *operands), stacks)

    return mapped


def _spread_call(
    calls: list[tuple[Callable, list[Array]]], shared: Any, spread: Spread
) -> list:
    """`[call(shared, *stacks) for call, stacks in calls]`, each stack's leading axis
    split over `spread`'s axes and the results replicated, with ONE collective for
    all of them (per result dtype).

    Each device computes its share of every call under one `jax.shard_map` (manual
    over `spread.axes`): its program holds no collective between the split and the
    gather of the results. In particular a data-dependent loop of a `call` (Shampoo's
    inverse roots: a batched `while_loop`, or on CPU one per matrix inside
    [`map_stack`][]'s `lax.map`) runs on each device's own matrices with a local
    predicate. Split by sharding constraints instead, XLA's partitioner makes a
    batched loop's predicate global: one all-reduce per iteration of every loop,
    across all devices (and processes), with nothing gained (the vmapped loop keeps
    each matrix's result its own whichever way the devices agree to stop).

    The split takes no collective either: the stacks are constrained to be
    replicated first, so each device slices its share locally. (Without that
    constraint XLA's partitioner propagated the split back into the stacks'
    producers and resharded them with all-to-alls: 38 of them in Shampoo's refresh
    in the two-process test.) The constraint is put behind a
    `jax.lax.optimization_barrier` (an identity), which XLA's sharding propagation
    does not see through (Shardy, jax 0.10.2). Without it the partitioner carried
    "replicated" back into the producers too, and a producer that is also part of
    the optimizer's state left the step replicated instead of sharded like its
    param (Muon's momentum, the Newton-Schulz input itself without Nesterov, came
    back `P()` for a param split `P('x')`).

    Every device's results, of every call, are flattened into one vector per dtype,
    and one all-gather per dtype replicates them. Fewer collectives matter across
    processes: XLA's CPU runtime starts independent collectives concurrently, from
    a thread pool, and its Gloo collectives all use one tag, so two processes that
    start two of them in different orders exchange the wrong messages (a crash on
    mismatched sizes, a hang, or swapped data: see the scaling guide).
    """
    if not calls:
        return []
    size = spread.size
    mesh = spread.mesh
    P = jax.sharding.PartitionSpec
    NamedSharding = jax.sharding.NamedSharding
    explicit = any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)
    split, whole = P(spread.axes), P()
    replicated = NamedSharding(mesh, whole)
    lengths, padded = [], []
    for _, stacks in calls:
        n = stacks[0].shape[0]
        pad = -n % size
        if pad:
            stacks = [
                jnp.concatenate([s, jnp.broadcast_to(s[:1], (pad,) + s.shape[1:])])
                for s in stacks
            ]
        if explicit:
            # Sharding in types: the operands get the shardings the `shard_map`
            # expects (on the mesh's other axes, replicated).
            stacks = [
                jax.sharding.reshard(s, NamedSharding(mesh, split)) for s in stacks
            ]
        else:
            # Replicated behind an optimization barrier: the constraint binds the
            # stack, not its producers (see above).
            stacks = [
                jax.lax.with_sharding_constraint(
                    jax.lax.optimization_barrier(s), replicated
                )
                for s in stacks
            ]
        lengths.append(n)
        padded.append(stacks)
    # Python numbers in `shared` stay static; arrays are passed in, replicated.
    leaves, treedef = jax.tree.flatten(shared)
    dynamic = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
    arrays = [leaves[i] for i in dynamic]
    if explicit:
        arrays = [jax.sharding.reshard(x, replicated) for x in arrays]
    counts = [len(stacks) for stacks in padded]
    # Filled while the body is traced: per call, its results' treedef and, per
    # leaf, (dtype, per-device shape, offset in that dtype's vector).
    layout: list = []
    dtypes: list = []

    def body(arrays, *flat_stacks):
        full = list(leaves)
        for i, x in zip(dynamic, arrays):
            full[i] = x
        shared_ = jax.tree.unflatten(treedef, full)
        pieces: dict = {}
        offsets: dict = {}
        start = 0
        layout.clear()
        for (call, _), k in zip(calls, counts):
            out = call(shared_, *flat_stacks[start : start + k])
            start += k
            out_leaves, out_def = jax.tree.flatten(out)
            where = []
            for o in out_leaves:
                dtype = jnp.dtype(o.dtype)
                if dtype not in pieces:
                    pieces[dtype], offsets[dtype] = [], 0
                    if dtype not in dtypes:
                        dtypes.append(dtype)
                where.append((dtype, o.shape, offsets[dtype]))
                pieces[dtype].append(o.reshape(-1))
                offsets[dtype] += o.size
            layout.append((out_def, where))
        return tuple(jnp.concatenate(pieces[d]) for d in dtypes)

    vectors = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(whole,) + (split,) * sum(counts),
        out_specs=split,
        axis_names=frozenset(spread.axes),
        # A `call` is written for any context (its loops start from constants,
        # which the varying-axes check would have it mark as device-varying); every
        # output is split, so nothing is claimed replicated that is not.
        check_vma=False,
    )(arrays, *(s for stacks in padded for s in stacks))
    if explicit:
        vectors = [jax.sharding.reshard(v, replicated) for v in vectors]
    else:
        vectors = [jax.lax.with_sharding_constraint(v, replicated) for v in vectors]
    # Device d's results, of every call, are row d.
    rows = {d: v.reshape(size, -1) for d, v in zip(dtypes, vectors)}
    outs = []
    for n, (out_def, where) in zip(lengths, layout):
        out_leaves = []
        for dtype, shape, offset in where:
            numel = math.prod(shape)
            piece = rows[dtype][:, offset : offset + numel]
            whole_stack = piece.reshape((size * shape[0],) + tuple(shape[1:]))
            out_leaves.append(whole_stack[:n])
        outs.append(jax.tree.unflatten(out_def, out_leaves))
    return outs
