"""Tree and dtype helpers shared by every optimizer.

The one rule behind them: only inexact JAX arrays are optimised, every other leaf maps
to `None`, and arithmetic runs in at least float32 while buffers keep their declared
dtype (design.md#dtype-rules).
"""

import functools as ft
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from beartype import beartype
from jaxtyping import Array, ArrayLike, Int32, jaxtyped

from ._custom_types import FilterSpec, ScalarOrSchedule
from ._random import chunked_draws, threefry_keys


# Every state class of eqxopt: used to tell a state passed where grads belong.
STATE_CLASSES: set[type] = set()


def typechecked(cls):
    """Decorate every state class with this: its jaxtyping annotations are checked by
    beartype whenever a state is built, i.e. at trace time under `jit`.

    The verdict depends only on what the annotations see: each argument's tree
    structure and, per leaf, its type, shape and dtype (or, for a Python scalar or
    string, its value). A combination that passed once is not checked again (the
    first check of a `PyTree[...]` field costs jaxtyping about 75 us per leaf, which
    made the checks a fifth of the trace time of a typical update); any other
    combination, a drifted dtype for one, is checked in full and raises as before."""
    out = jaxtyped(typechecker=beartype)(cls)
    checked = out.__init__
    plain = checked.__wrapped__
    passed: set = set()

    @ft.wraps(plain)
    def __init__(self, *args, **kwargs):
        key = _abstract_key(args, kwargs)
        if key is not None and key in passed:
            return plain(self, *args, **kwargs)
        checked(self, *args, **kwargs)
        if key is not None:
            if len(passed) > 10_000:  # bounded memory, whatever a program traces
                passed.clear()
            passed.add(key)

    out.__init__ = __init__
    STATE_CLASSES.add(out)
    return out


_ARRAYS = (jax.Array, np.ndarray, np.generic)


def _abstract_key(args, kwargs):
    """What a type check of `(args, kwargs)` sees, hashable; `None` when some leaf is
    neither an array nor a hashable Python value (always checked in full)."""
    leaves, treedef = jtu.tree_flatten((args, kwargs))
    parts: list = [treedef]
    for x in leaves:
        if isinstance(x, _ARRAYS):
            parts.append((type(x), x.shape, x.dtype))
        elif isinstance(x, (bool, int, float, complex, str)):
            parts.append((type(x), x))
        else:
            return None
    key = tuple(parts)
    return key if hashable(key) else None


def hashable(x) -> bool:
    """Whether `hash(x)` succeeds (e.g. a static part of a compilation key)."""
    try:
        hash(x)
    except TypeError:
        return False
    return True


def is_none(x: Any) -> bool:
    return x is None


class OpaqueLeaf(eqx.Module):
    """A state value that stands for one param leaf although it is a Module of several
    arrays (a quantized buffer, `eqxopt.QuantizedArray`): [`tree_map`][] passes it
    whole to the per-leaf function, where a param-shaped array would be."""


def is_none_or_opaque(x: Any) -> bool:
    return x is None or isinstance(x, OpaqueLeaf)


is_param = eqx.is_inexact_array


def _paths(tree) -> list[str]:
    leaves = jtu.tree_flatten_with_path(tree, is_leaf=is_none)[0]
    return [jtu.keystr(path) for path, _ in leaves]


def check_same_structure(reference, other, *, names: tuple[str, str]) -> None:
    """Raise a `ValueError` naming the first path where two trees differ."""
    if jtu.tree_structure(reference, is_leaf=is_none) == jtu.tree_structure(
        other, is_leaf=is_none
    ):
        return
    a, b = _paths(reference), _paths(other)
    only_a = [p for p in a if p not in set(b)]
    only_b = [p for p in b if p not in set(a)]
    if only_a or only_b:
        where = (
            f"`{names[0]}` has a leaf at `{only_a[0]}` that `{names[1]}` lacks"
            if only_a
            else f"`{names[1]}` has a leaf at `{only_b[0]}` that `{names[0]}` lacks"
        )
    else:
        where = "their containers differ: " + (
            f"{jtu.tree_structure(reference, is_leaf=is_none)} vs "
            f"{jtu.tree_structure(other, is_leaf=is_none)}"
        )
    raise ValueError(
        f"eqxopt: `{names[0]}` and `{names[1]}` must have the same tree structure, but "
        f"{where}. Pass grads with the structure of the params the state was "
        "initialised with (`eqx.filter_grad` gives `None` for non-array leaves)."
    )


def tree_map(f: Callable, tree, *rest, names: Sequence[str] | None = None):
    """Map `f` over the inexact-array leaves of `tree`; every other leaf maps to `None`.

    Each of `rest` must have `tree`'s structure (checked, with a clear error), or be
    `None`, which stands for `None` at every leaf.
    """
    names = (
        list(names)
        if names is not None
        else ["grads"] + [f"tree {i}" for i in range(1, len(rest) + 1)]
    )
    filled = []
    structure = None
    for name, other in zip(names[1:], rest):
        if other is None:
            other = jtu.tree_map(lambda _: None, tree, is_leaf=is_none)
        else:
            # Fast path (trace time, once per call): identical structures need no
            # stripping of the leaves that are not optimised.
            if structure is None:
                structure = jtu.tree_structure(tree, is_leaf=is_none_or_opaque)
            if jtu.tree_structure(other, is_leaf=is_none_or_opaque) != structure:
                check_same_structure(
                    only_params(tree), only_params(other), names=(names[0], name)
                )
        filled.append(other)

    # Trees that mirror the params leaf for leaf must match them in shape too.
    mirrors = tuple(
        i for i, name in enumerate(names[1:]) if name.startswith(("params", "state."))
    )
    apply = ft.partial(_apply_leaf, f, tuple(names), mirrors)
    return jtu.tree_map_with_path(apply, tree, *filled, is_leaf=is_none_or_opaque)


def _apply_leaf(f, names, mirrors, path, x, *xs):
    """`tree_map`'s work at one leaf (module level: built once, not once per call)."""
    if isinstance(x, OpaqueLeaf):
        return f(x, *xs)
    if not is_param(x):
        return None
    for i in mirrors:
        y = xs[i]
        if names[i + 1] == "params" and eqx.is_array(y) and not is_param(y):
            where = jtu.keystr(path)
            raise ValueError(
                f"eqxopt: `{names[0]}{where}` is a {x.dtype} gradient, but "
                f"`params{where}` is {y.dtype}: only floating-point and complex "
                "leaves are optimised, so its gradient must be None (as "
                "`eqx.filter_grad` gives), or the param a floating-point array."
            )
        if is_param(y) and y.shape != x.shape:
            where = jtu.keystr(path)
            raise ValueError(
                f"eqxopt: `{names[0]}{where}` has shape {x.shape}, but "
                f"`{names[i + 1]}{where}` has shape {y.shape}. Pass grads of the "
                "params' shapes (the params the state was initialised with)."
            )
    return f(x, *xs)


def only_params(tree):
    """`tree` with every leaf that is not optimised replaced by `None`."""
    return jtu.tree_map(lambda x: x if is_param(x) else None, tree, is_leaf=is_none)


class _Pack:
    """A tuple that pytrees treat as a single leaf (used to unzip per-leaf results)."""

    __slots__ = ("values",)

    def __init__(self, *values):
        self.values = values


pack = _Pack


def tree_map_unzip(f: Callable, n: int, tree, *rest, names=None) -> tuple:
    """As [`tree_map`][], for an `f` that returns `pack(out_1, ..., out_n)`."""
    out = tree_map(f, tree, *rest, names=names)
    return tuple(
        jtu.tree_map(
            lambda o: o.values[i] if isinstance(o, _Pack) else None,
            out,
            is_leaf=lambda x: x is None or isinstance(x, _Pack),
        )
        for i in range(n)
    )


def zeros_like(params, dtype=None):
    """Zeros for every optimised leaf, in `dtype` or else the leaf's own dtype, placed
    like the leaf (see [`zeros_like_leaf`][])."""
    return tree_map(lambda p: zeros_like_leaf(p, dtype or p.dtype), params)


def zeros_like_leaf(p: Array, dtype=None) -> Array:
    """Zeros of `p`'s shape, in `dtype` (default `p`'s), sharded like `p`.

    Eagerly, `jnp.zeros_like` keeps a sharded `p`'s sharding (`jnp.zeros(p.shape)` would
    not). Under `jit`, zeros do not depend on `p`, so XLA's sharding propagation would
    replicate them: `shard_alike` ties their sharding to `p`'s. Use this for every state
    buffer that mirrors a param.
    """
    return full_like_leaf(p, 0, dtype)


def full_like_leaf(p: Array, value, dtype=None) -> Array:
    """`value` everywhere, in `p`'s shape and `dtype` (default `p`'s), sharded like `p`
    (as [`zeros_like_leaf`][]). `value` may be a number, an array or a tracer."""
    z = jnp.full_like(p, value, dtype=dtype or p.dtype)
    if isinstance(p, jax.core.Tracer):
        try:
            from jax.experimental.shard_alike import shard_alike
        except ImportError:  # pragma: no cover
            return z
        z = shard_alike(p, z)[1]
    return z


def sharded_like(x: Array, ref: Any) -> Array:
    """`x` resharded to `ref`'s sharding where both are typed with different shardings
    over `Explicit` mesh axes (sharding in types), as when a gradient (sharded like
    its param) meets a state buffer split further over a data-parallel axis
    (`eqxopt.state_shardings(..., shard_over=...)`): selects and `lax.cond` branches
    need equal types there. Otherwise `x` unchanged (on `Auto` axes XLA places every
    op itself), and unchanged next to a quantized buffer (an [`OpaqueLeaf`][])."""
    if isinstance(ref, OpaqueLeaf):
        return x
    want = getattr(jax.typeof(ref), "sharding", None)
    have = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(want, "mesh", None)
    if (
        want is None
        or have is None
        or mesh is None
        or mesh.empty
        or not any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)
        or want == have
    ):
        return x
    return jax.sharding.reshard(x, want)


def explicit_sharding(x: Any) -> Any:
    """`x`'s sharding if `x` is a traced array sharded over `Explicit` mesh axes
    (sharding in types), else `None`. With `Auto` axes the types carry no sharding
    and GSPMD places every op itself; with `Explicit` axes an op whose output
    sharding cannot be inferred (a gather along a sharded axis, a `where` of
    differently sharded operands) must be given one: the callers pass this one
    back (`x.at[...].get(out_sharding=...)`, `jax.sharding.reshard`)."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    spec = getattr(sharding, "spec", None)
    if spec is None or all(s is None for s in spec):
        return None
    mesh = getattr(sharding, "mesh")
    if not any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        return None
    return sharding


def compute_dtype(*dtypes) -> np.dtype:
    """The dtype per-leaf arithmetic runs in: the promotion of `dtypes` and float32.

    bfloat16 and float16 buffers are computed in float32 and stored back, so that
    `eps=1e-8` or `b2=0.999` never round to 0 or 1 inside the step.
    """
    # Called once per leaf at trace time, so cached. The key keeps each argument's
    # type: `float` (weak, promotes to float32) must not meet `np.dtype(float)`.
    try:
        key = tuple((type(d), d) for d in dtypes)
        out = _COMPUTE_DTYPES.get(key)
    except TypeError:  # an unhashable argument
        return _promote(dtypes)
    if out is None:
        out = _COMPUTE_DTYPES[key] = _promote(dtypes)
    return out


_COMPUTE_DTYPES: dict = {}


def _promote(dtypes) -> np.dtype:
    with jax.numpy_dtype_promotion("standard"):
        return ft.reduce(jnp.promote_types, dtypes, np.dtype(jnp.float32))


def out_dtype(grad: Array, param: Array | None):
    """The dtype of an update: the param's (API rule 4), or the grad's without one."""
    return grad.dtype if param is None else param.dtype


class per_dtype:
    """`fn(dtype)`, computed once per dtype and then reused: the scalars of one update
    (cast hyperparameters, bias corrections) are traced once, not once per leaf.
    Create it inside `update` (it holds traced values of that call)."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.cache = {}

    def __call__(self, dtype):
        key = np.dtype(dtype)
        if key not in self.cache:
            self.cache[key] = self.fn(key)
        return self.cache[key]


def scalar(value: ArrayLike, dtype) -> Array:
    """A hyperparameter as a scalar of `dtype`, with an explicit cast (strict mode)."""
    return jnp.asarray(value, dtype)


def resolve(value: ScalarOrSchedule, count: Array | None) -> ArrayLike:
    """Evaluate a hyperparameter: a schedule is called at `count`, a number returned."""
    if callable(value) and not isinstance(value, (jax.Array, np.ndarray)):
        if count is None:
            raise ValueError("eqxopt: a schedule needs a step count to evaluate.")
        return value(count)
    return value


def zero_count() -> Int32[Array, ""]:
    return jnp.zeros((), jnp.int32)


def increment(count: Int32[Array, ""]) -> Int32[Array, ""]:
    """`count + 1`, saturating at the int32 maximum instead of wrapping round."""
    return jax.lax.select(count < jnp.iinfo(jnp.int32).max, count + 1, count)


def scalar_state_dtype(params, state_dtype=None):
    """The dtype of a 0-d running scalar of the state (a distance estimate, a sum of
    squared norms, a loss average): `state_dtype` if given, else the compute dtype of
    the params (at least float32, so that a running sum keeps growing for bfloat16
    params; Optax uses the lowest-precision param dtype)."""
    if state_dtype is not None:
        return jnp.dtype(state_dtype)
    leaves = [x for x in jtu.tree_leaves(params) if is_param(x)]
    return real_dtype(compute_dtype(*(x.dtype for x in leaves)))


def draws_per_leaf(
    sample: Callable, keys: Array, specs: Sequence[tuple[tuple[int, ...], Any]]
) -> list[Array]:
    """`[sample(k, shape, dtype) for k, (shape, dtype) in zip(keys, specs)]` (`sample`
    as `jax.random.normal`, drawing each element from its own random bits; `keys` a
    key array): the same numbers, with one copy of the sampler (threefry, and for a
    normal draw the inverse error function) in the compiled program, not one per
    leaf. With threefry keys, every leaf's draw comes from one `vmap`-ed call over
    chunks of the draws ([`eqxopt._random.chunked_draws`][]): one copy in all; on
    Kron's 10M-param, 63-leaf tree its draws compile in 1.6 s instead of 3.1 s.
    Otherwise same-shape leaves are drawn by one `vmap`-ed call (one copy per shape)
    with threefry keys, and each leaf alone with others (`rbg`, whose `vmap`-ed draws
    differ from its draws alone)."""
    chunked = chunked_draws(sample, keys, specs)
    if chunked is not None:
        return chunked
    groups: dict[Any, list[int]] = {}
    # Other key implementations (`rbg`) draw otherwise under `vmap` than alone.
    threefry = threefry_keys(keys)
    for j, (shape, dtype) in enumerate(specs):
        group = (tuple(shape), jnp.dtype(dtype)) if threefry else j
        groups.setdefault(group, []).append(j)
    draws: list[Any] = [None] * len(specs)
    for members in groups.values():
        shape, dtype = specs[members[0]]
        if len(members) == 1:
            (j,) = members
            draws[j] = sample(keys[j], shape, dtype)
            continue
        stacked = jax.vmap(lambda k: sample(k, shape, dtype))(keys[np.asarray(members)])
        for n, j in enumerate(members):
            draws[j] = stacked[n]
    return draws


def real_vdot(a: Array, b: Array) -> Array:
    r"""$\mathrm{Re}\sum \bar a\, b$: the inner product of two leaves (as real
    vectors, for complex leaves)."""
    if jnp.iscomplexobj(a) or jnp.iscomplexobj(b):
        return jnp.sum(jnp.real(jnp.conj(a) * b))
    return jnp.sum(a * b)


def tree_total(tree, dtype) -> Array:
    """The sum of the 0-d leaves of `tree` (per-leaf partial sums), in `dtype`."""
    total = jnp.zeros((), dtype)
    for x in jtu.tree_leaves(tree):
        total = total + x.astype(dtype)
    return total


def tree_sum_of_squares(tree) -> Array:
    """Sum of squares over all optimised leaves, in at least float32."""
    leaves = [x for x in jtu.tree_leaves(tree) if is_param(x)]
    if not leaves:
        return jnp.zeros((), jnp.float32)
    dtype = compute_dtype(*(x.dtype for x in leaves))
    return sum(
        (
            jnp.sum(jnp.real(x.astype(dtype) * jnp.conj(x.astype(dtype))))
            for x in leaves
        ),
        start=jnp.zeros((), real_dtype(dtype)),
    )


def global_norm(tree) -> Array:
    return jnp.sqrt(tree_sum_of_squares(tree))


def abs_sq(x: Array) -> Array:
    """`|x|^2`, also for complex `x`."""
    if jnp.iscomplexobj(x):
        return jnp.real(x * jnp.conj(x))
    return x * x


def strong(x: Array) -> Array:
    """`x` without a weak type (an explicit cast to its own dtype; a no-op for an
    array that has none)."""
    return x.astype(x.dtype)


def real_dtype(dtype) -> np.dtype:
    """The real dtype of `dtype`'s values: `float32` for `complex64`, itself for a
    floating dtype."""
    return np.dtype(jnp.finfo(dtype).dtype)


def clip_magnitude(x: Array, bound) -> Array:
    """`x` clipped to `[-bound, bound]`; a complex `x` keeps its phase and has its
    modulus clipped to `bound` (the same thing for a real `x`). `bound` >= 0."""
    if not jnp.iscomplexobj(x):
        return jnp.clip(x, -bound, bound)
    modulus = jnp.abs(x)
    bound = jnp.asarray(bound, modulus.dtype)
    scale = bound / jnp.where(modulus > bound, modulus, jnp.ones((), modulus.dtype))
    return jnp.where(modulus > bound, x * scale.astype(x.dtype), x)


# --- filter specs (masks, labels): Equinox's convention, as in `eqx.partition` -------


def resolve_filter_spec(spec: FilterSpec, params, *, what: str, bools: bool = False):
    """The one resolver of filter specs (masks, labels, weight-decay masks, Muon's
    routing): a tree with the structure of `params` holding one value per optimised
    leaf, and `None` at every other leaf.

    `spec` is a PyTree prefix of `params` whose leaves are values or callables applied
    to each param leaf below them; a bare callable is a per-leaf predicate. An
    `eqx.Module` is a tree and is never called. Callables are applied to optimised
    leaves (inexact arrays) only, so `lambda p: p.ndim == 2` never meets a model's
    activation function. With `bools=True` every value must be a concrete bool (a
    Python or NumPy bool, or a 0-d concrete bool array), never a traced one.
    """

    def _is_spec_leaf(x):
        return callable(x) and not isinstance(x, eqx.Module) or not _is_container(x)

    def _broadcast(sub_spec, sub_params):
        if callable(sub_spec) and not isinstance(sub_spec, eqx.Module):
            fn = lambda p: sub_spec(p) if is_param(p) else None
        else:
            fn = lambda p: sub_spec if is_param(p) else None
        return jtu.tree_map(fn, sub_params, is_leaf=is_none)

    try:
        values = jtu.tree_map(_broadcast, spec, params, is_leaf=_is_spec_leaf)
    except ValueError as e:
        raise ValueError(
            f"eqxopt: the {what} must be a PyTree prefix of the params (as a filter "
            f"spec for `eqx.partition`), or a callable applied to each leaf. Its "
            f"structure\n  {jtu.tree_structure(spec, is_leaf=_is_spec_leaf)}\ndoes "
            f"not fit the params'\n  {jtu.tree_structure(params, is_leaf=is_none)}"
        ) from e
    if not bools:
        return values

    def _as_bool(path, p, v):
        if not is_param(p):
            return None
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
        traced = isinstance(v, jax.core.Tracer)
        if isinstance(v, (jax.Array, np.ndarray)) and not traced:
            if np.shape(v) == () and np.asarray(v).dtype == np.bool_:
                return bool(v)
        hint = (
            " It is a traced array: decide the mask from static information (shapes, "
            "dtypes, the tree), not from values, and keep its leaves Python bools."
            if traced
            else ""
        )
        raise ValueError(
            f"eqxopt: the {what} must give one bool per param leaf, but at "
            f"`params{jtu.keystr(path)}` it gives {v!r}.{hint}"
        )

    return jtu.tree_map_with_path(_as_bool, params, values, is_leaf=is_none)


def _is_container(x) -> bool:
    return jtu.tree_structure(x, is_leaf=is_none) != jtu.tree_structure(0)


def mask_field(**kwargs):
    """A dataclass field that holds a filter spec, not a hyperparameter."""
    return eqx.field(metadata={"eqxopt_filter_spec": True}, **kwargs)


def replace_fields(module: eqx.Module, **changes) -> eqx.Module:
    """`dataclasses.replace` for Modules with custom `__init__`s (via `eqx.tree_at`)."""
    names = list(changes)
    return eqx.tree_at(
        lambda m: [getattr(m, n) for n in names],
        module,
        [changes[n] for n in names],
        is_leaf=is_none,
    )


def lowest_dtype(params):
    """The lowest-precision float dtype among the params (Optax's choice for the
    scalar state), float32 when there is none."""
    dtypes = [
        np.dtype(x.dtype)
        for x in jtu.tree_leaves(params)
        if is_param(x) and jnp.issubdtype(x.dtype, jnp.floating)
    ]
    if not dtypes:
        return np.dtype(jnp.float32)
    return min(dtypes, key=lambda d: (jnp.finfo(d).bits, jnp.finfo(d).nmant))


def write_after(x: Array, dependency: Array) -> Array:
    """`x`, bit for bit, computed after `dependency`: the one way eqxopt orders a
    buffer's write after a read of it.

    In a jitted step with a donated state, XLA on CPU writes a new buffer over the old
    one in place only once every reader of the old value has run; when the old value
    is read twice (for the new params and for the new buffer, as Lion's momentum is),
    or by a reduction, XLA copies it first. Adding an exact `-0.0` computed from what
    must be read first (the new params, the reduction's result) orders the write after
    it, so the copy goes away: measured on the 63-leaf benchmark tree, DAdaptAdamW's
    donated step made 42 param-sized copies without it and 0 with it (Optax's: 42),
    AcProp's 42 and 21. `x + (-0.0) == x` for every `x`, `-0.0` and NaN included.
    """
    zero = jnp.where(jnp.isfinite(dependency), -(jnp.abs(dependency) * 0), -0.0)
    zero = zero.astype(real_dtype(x.dtype))
    if jnp.iscomplexobj(x):
        zero = jax.lax.complex(zero, zero)
    return x + zero
