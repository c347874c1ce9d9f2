"""Checkpoints that are checked against their target before anything is read: a
mismatch (another optimizer, another param tree, another state dtype) raises
`CheckpointMismatchError` naming the first path that differs, instead of a
deserialisation traceback or, worse, a silent mix-up of leaves.

`eqx.tree_deserialise_leaves` reads leaves in order from a file that records no
structure, so only a file that carries its own description can be checked fully:
`save_checkpoint` writes one (a header describing every leaf, then Equinox's own
leaf stream), `load_checkpoint` checks it and reads the leaves with Equinox.
`check_checkpoint` also checks plain `eqx.tree_serialise_leaves` files (leaf count,
shapes and dtypes, from each leaf's NumPy header) and Orbax checkpoints (paths, shapes
and dtypes, from Orbax's metadata)."""

import json
import math
import os
import pathlib
import struct
from collections.abc import Callable
from typing import Any, BinaryIO

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np


_MAGIC = b"EQXOPT-CHECKPOINT\x00"
_VERSION = 1
_NUMPY_MAGIC = b"\x93NUMPY"

PathLike = str | os.PathLike


class CheckpointMismatchError(ValueError):
    """A checkpoint does not match the tree it is restored into.

    Raised by [`eqxopt.load_checkpoint`][] and [`eqxopt.check_checkpoint`][] before
    any array is read. `path` is the first path that differs (`jax.tree_util.keystr`
    form, e.g. `[1].nu['w']`); the message says what the checkpoint holds there and
    what the target expects.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3))}
        eqxopt.save_checkpoint("adam.eqx", eqxopt.Adam(1e-3).init(params))
        lion = eqxopt.Lion(1e-4)
        try:
            eqxopt.load_checkpoint("adam.eqx", eqxopt.abstract_state(lion, params))
        except eqxopt.CheckpointMismatchError as e:
            assert e.path == ""  # at the root: an AdamState, not a LionState
        ```
    """

    path: str

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(message)


# --- describing a tree ------------------------------------------------------------


def _is_leaf_node(x) -> bool:
    return jtu.treedef_is_leaf(jtu.tree_structure(x))


def _children(node):
    """`[(key, child)]` one level down (None children hold no leaves: skipped)."""
    flat, _ = jtu.tree_flatten_with_path(
        node, is_leaf=lambda x: x is not node and x is not None
    )
    return [(path[0], child) for path, child in flat]


def _leaf_kind(x) -> dict | None:
    """What `eqx.tree_serialise_leaves` writes for leaf `x` (None: nothing)."""
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
        return {"kind": "array", "shape": list(x.shape), "dtype": str(x.dtype)}
    if isinstance(x, np.ndarray):
        return {"kind": "numpy", "shape": list(x.shape), "dtype": str(x.dtype)}
    if isinstance(x, np.generic):
        return {"kind": "numpy scalar", "shape": [], "dtype": str(x.dtype)}
    if isinstance(x, (bool, int, float, complex)):
        return {"kind": type(x).__name__, "shape": [], "dtype": None}
    return None  # functions, strings, ...: not written


def _describe(tree) -> list[dict]:
    """One entry per leaf `eqx.tree_serialise_leaves` writes, in its order: the
    leaf's path, the types of the nodes above it, and what is written."""
    out = []

    def walk(node, keys, nodes):
        if _is_leaf_node(node):
            kind = _leaf_kind(node)
            if kind is not None:
                out.append({"path": jtu.keystr(keys), "nodes": nodes, **kind})
            return
        here = [*nodes, [jtu.keystr(keys), type(node).__qualname__]]
        for key, child in _children(node):
            walk(child, (*keys, key), here)

    walk(tree, (), [])
    return out


def _what(entry: dict) -> str:
    if entry["kind"] in ("array", "numpy", "numpy scalar"):
        return f"a {entry['kind']} {entry['dtype']}{tuple(entry['shape'])}"
    return f"a Python {entry['kind']}"


def _compare(saved: list[dict], like: list[dict], source: str) -> None:
    """Raise `CheckpointMismatchError` at the first entry that differs."""
    for s, t in zip(saved, like):
        for (s_path, s_type), (t_path, t_type) in zip(s["nodes"], t["nodes"]):
            if s_path == t_path and s_type != t_type:
                raise CheckpointMismatchError(
                    t_path,
                    f"{source} does not match the target at `{t_path or '<root>'}`: "
                    f"the checkpoint holds a `{s_type}` there, the target a "
                    f"`{t_type}`.",
                )
        if s["path"] != t["path"]:
            raise CheckpointMismatchError(
                t["path"],
                f"{source} does not match the target at `{t['path']}`: the target "
                f"has a leaf there, the checkpoint has `{s['path']}` instead.",
            )
        if (s["kind"], s["shape"], s["dtype"]) != (t["kind"], t["shape"], t["dtype"]):
            raise CheckpointMismatchError(
                t["path"],
                f"{source} does not match the target at `{t['path']}`: the checkpoint "
                f"holds {_what(s)}, the target expects {_what(t)}.",
            )
    if len(saved) > len(like):
        extra = saved[len(like)]["path"]
        raise CheckpointMismatchError(
            extra,
            f"{source} does not match the target at `{extra}`: the checkpoint has "
            f"{len(saved) - len(like)} more leaves, from `{extra}` on.",
        )
    if len(like) > len(saved):
        missing = like[len(saved)]["path"]
        raise CheckpointMismatchError(
            missing,
            f"{source} does not match the target at `{missing}`: the checkpoint "
            f"ends before it ({len(saved)} leaves; the target has {len(like)}).",
        )


# --- eqxopt files -------------------------------------------------------------------


def _write_header(f: BinaryIO, tree) -> None:
    body = json.dumps({"version": _VERSION, "leaves": _describe(tree)}).encode()
    f.write(_MAGIC + struct.pack("<Q", len(body)) + body)


def _read_header(f: BinaryIO) -> list[dict] | None:
    """The leaf descriptions of an eqxopt checkpoint, with `f` left at its first
    leaf; `None` (and `f` rewound) for a plain Equinox file."""
    start = f.tell()
    if f.read(len(_MAGIC)) != _MAGIC:
        f.seek(start)
        return None
    (size,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(size))
    if header.get("version") != _VERSION:
        raise ValueError(
            f"This checkpoint was written by a newer eqxopt (format version "
            f"{header.get('version')}); this eqxopt reads version {_VERSION}."
        )
    return header["leaves"]


def _scan_plain(f: BinaryIO) -> list[tuple[tuple[int, ...], np.dtype]]:
    """The shape and dtype of every array in a plain `eqx.tree_serialise_leaves`
    stream (each leaf is one `.npy` record), read from their headers only."""
    start, out = f.tell(), []
    while True:
        if f.read(len(_NUMPY_MAGIC)) != _NUMPY_MAGIC:
            break
        f.seek(-len(_NUMPY_MAGIC), os.SEEK_CUR)
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        out.append((tuple(shape), dtype))
        f.seek(math.prod(shape) * dtype.itemsize, os.SEEK_CUR)
    f.seek(start)
    return out


def _check_plain(f: BinaryIO, like, source: str) -> None:
    records = _scan_plain(f)
    entries = _describe(like)
    for (shape, dtype), t in zip(records, entries):
        want = np.dtype(t["dtype"]) if t["dtype"] is not None else None
        # bfloat16 and other ml_dtypes are stored as raw bytes (`V2`) by NumPy.
        same_dtype = (
            want is None
            or dtype == want
            or (dtype.kind == "V" and dtype.itemsize == want.itemsize)
        )
        if list(shape) != t["shape"] or not same_dtype:
            raise CheckpointMismatchError(
                t["path"],
                f"{source} does not match the target at `{t['path']}`: the checkpoint "
                f"holds an array {dtype}{shape} there, the target expects "
                f"{_what(t)}.",
            )
    if len(entries) > len(records):
        missing = entries[len(records)]["path"]
        raise CheckpointMismatchError(
            missing,
            f"{source} does not match the target at `{missing}`: the checkpoint "
            f"ends before it ({len(records)} leaves; the target has {len(entries)}).",
        )
    if len(records) > len(entries):
        raise CheckpointMismatchError(
            "",
            f"{source} does not match the target: the checkpoint has "
            f"{len(records)} leaves, the target only {len(entries)}.",
        )


def _default_load(f, like):
    """Equinox's loading, except that a `jax.ShapeDtypeStruct` with a sharding is
    placed on it."""
    if isinstance(like, jax.ShapeDtypeStruct) and like.sharding is not None:
        return jax.device_put(jnp.load(f), like.sharding)
    return eqx.default_deserialise_filter_spec(f, like)


def save_checkpoint(path_or_file: PathLike | BinaryIO, pytree: Any) -> None:
    """Save a PyTree (a model, an optimizer's state, `(model, opt, state)`, ...) with
    a description of its structure, so that [`eqxopt.load_checkpoint`][] can check
    it against its target before reading anything.

    The file is a short header followed by exactly what `eqx.tree_serialise_leaves`
    writes: every array and Python number, in order.

    **Arguments:**

    - `path_or_file`: a path (`.eqx` is appended when it has no suffix, as by
        Equinox) or a binary file open for writing.
    - `pytree`: the PyTree to save.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        opt = eqxopt.AdamW(1e-3)
        state = opt.init(params)
        eqxopt.save_checkpoint("state.eqx", state)

        # Restore into another optimizer version: new hyperparameters, same state.
        new_opt = eqxopt.AdamW(3e-4, weight_decay=0.1)
        state2 = eqxopt.load_checkpoint(
            "state.eqx", eqxopt.abstract_state(new_opt, params)
        )
        updates, state2 = new_opt.update(params, state2, params)
        ```
    """
    with _maybe_open(path_or_file, "wb") as f:
        _write_header(f, pytree)
        eqx.tree_serialise_leaves(f, pytree)


def load_checkpoint(
    path_or_file: PathLike | BinaryIO,
    like: Any,
    *,
    filter_spec: Callable | None = None,
) -> Any:
    """Load a checkpoint into a tree like `like`, after checking that they match.

    `like` gives the structure, shapes and dtypes: concrete arrays or
    `jax.ShapeDtypeStruct`s, e.g. from `jax.eval_shape`, `eqx.filter_eval_shape` or
    [`eqxopt.abstract_state`][]. A struct with a `sharding` is loaded onto it, so a
    sharded state is restored sharded. Python numbers in `like` (e.g. float
    hyperparameters of an optimizer) are replaced by the saved ones, as by
    `eqx.tree_deserialise_leaves`; to continue with new hyperparameters, restore the
    state only and keep your new optimizer.

    Files from [`eqxopt.save_checkpoint`][] are checked fully: every path, the type
    of every node (an `AdamState` is not a `LionState`, even with the same leaves),
    shapes and dtypes. Plain `eqx.tree_serialise_leaves` files are read too, and
    checked for their number of leaves, shapes and dtypes.

    **Arguments:**

    - `path_or_file`: a path or a binary file open for reading.
    - `like`: the target tree.
    - `filter_spec`: as for `eqx.tree_deserialise_leaves`. Default: Equinox's,
        placing sharded structs on their sharding.

    **Returns:**

    A tree like `like`, holding the saved values.

    **Raises:**

    [`eqxopt.CheckpointMismatchError`][] (a `ValueError`) naming the first path
    where the checkpoint and `like` differ; nothing has been read then.

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3))}
        opt = eqxopt.Adam(1e-3)
        eqxopt.save_checkpoint("adam_state.eqx", opt.init(params))
        like = jax.eval_shape(opt.init, params)
        state = eqxopt.load_checkpoint("adam_state.eqx", like)
        assert state.mu["w"].shape == (2, 3)

        other_params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(2)}  # another model
        try:
            eqxopt.load_checkpoint("adam_state.eqx", opt.init(other_params))
        except eqxopt.CheckpointMismatchError as e:
            print(e)  # names `.mu['b']`
        ```
    """
    filter_spec = _default_load if filter_spec is None else filter_spec
    with _maybe_open(path_or_file, "rb") as f:
        _check_open(f, like, _source(path_or_file))
        return eqx.tree_deserialise_leaves(f, like, filter_spec=filter_spec)


def check_checkpoint(path_or_file: PathLike | BinaryIO, like: Any) -> None:
    """Check, without reading any array, that a checkpoint can be restored into
    `like`; raise [`eqxopt.CheckpointMismatchError`][] naming the first path that
    differs otherwise.

    Takes a file from [`eqxopt.save_checkpoint`][] (checked as by
    [`eqxopt.load_checkpoint`][]), a plain `eqx.tree_serialise_leaves` file (number
    of leaves, shapes and dtypes), or an [Orbax](https://orbax.readthedocs.io)
    checkpoint directory (every path, shape and dtype, from its metadata). Orbax
    itself reports a missing or extra path but not which array has another shape,
    and casts to the target's dtype without a word; call this before
    `checkpointer.restore(path, target)`.

    **Arguments:**

    - `path_or_file`: the checkpoint (a file, an open binary file, or an Orbax
        checkpoint directory).
    - `like`: the target tree, as for [`eqxopt.load_checkpoint`][] (for Orbax: the
        target given to `restore`).

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3))}
        opt = eqxopt.Adam(1e-3)
        eqxopt.save_checkpoint("adam_state.eqx", opt.init(params))
        eqxopt.check_checkpoint("adam_state.eqx", eqxopt.abstract_state(opt, params))
        bf16 = eqxopt.Adam(1e-3, state_dtype=jnp.bfloat16)
        try:
            eqxopt.check_checkpoint(
                "adam_state.eqx", eqxopt.abstract_state(bf16, params)
            )
        except eqxopt.CheckpointMismatchError as e:
            assert e.path == ".mu['w']"  # float32 saved, bfloat16 expected
        ```
    """
    if isinstance(path_or_file, (str, os.PathLike)) and os.path.isdir(path_or_file):
        _check_orbax(pathlib.Path(path_or_file), like)
        return
    with _maybe_open(path_or_file, "rb") as f:
        _check_open(f, like, _source(path_or_file))


def _check_open(f: BinaryIO, like, source: str) -> None:
    saved = _read_header(f)
    if saved is None:
        _check_plain(f, like, source)
    else:
        _compare(saved, _describe(like), source)


def _source(path_or_file) -> str:
    if isinstance(path_or_file, (str, os.PathLike)):
        return f"The checkpoint `{os.fspath(path_or_file)}`"
    return "The checkpoint"


class _maybe_open:
    """A path is opened (with Equinox's `.eqx` suffix rule), a file is used as is."""

    def __init__(self, path_or_file, mode: str):
        self.path_or_file, self.mode, self.file = path_or_file, mode, None

    def __enter__(self) -> BinaryIO:
        if isinstance(self.path_or_file, (str, os.PathLike)):
            path = pathlib.Path(self.path_or_file)
            if path.suffix == "":
                path = path.with_suffix(".eqx")
            self.file = open(path, self.mode)
            return self.file  # pyright: ignore[reportReturnType]
        return self.path_or_file

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.file.close()


# --- Orbax --------------------------------------------------------------------------


def _key_name(key) -> str:
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _check_orbax(path: pathlib.Path, like) -> None:
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as checkpointer:
        metadata = checkpointer.metadata(path)
    tree = getattr(metadata, "item_metadata", metadata)
    saved = {}
    for keys, leaf in jtu.tree_flatten_with_path(tree)[0]:
        saved[tuple(_key_name(k) for k in keys)] = leaf
    source = f"The Orbax checkpoint `{path}`"
    seen = set()
    for keys, leaf in jtu.tree_flatten_with_path(like)[0]:
        kind = _leaf_kind(leaf)
        if kind is None:
            continue
        where = jtu.keystr(keys)
        name = tuple(_key_name(k) for k in keys)
        if name not in saved:
            raise CheckpointMismatchError(
                where,
                f"{source} does not match the target at `{where}`: the checkpoint "
                "has no leaf there.",
            )
        seen.add(name)
        s = saved[name]
        s_shape = list(getattr(s, "shape", ()))
        s_dtype = str(getattr(s, "dtype", None))
        if s_shape != kind["shape"] or (
            kind["dtype"] is not None and s_dtype != kind["dtype"]
        ):
            raise CheckpointMismatchError(
                where,
                f"{source} does not match the target at `{where}`: the checkpoint "
                f"holds an array {s_dtype}{tuple(s_shape)}, the target expects "
                f"{_what(kind)}.",
            )
    for name in saved:
        if name not in seen:
            where = ".".join(name)
            raise CheckpointMismatchError(
                where,
                f"{source} does not match the target at `{where}`: the checkpoint "
                "has a leaf there that the target lacks.",
            )
