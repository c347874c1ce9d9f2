"""Muon and NorMuon: momentum orthogonalized by Newton-Schulz, with a fallback for
non-matrices; NorMuon adds a row-wise (neuron-wise) second-moment normalization."""

import dataclasses
import math
from typing import Any, Generic, TYPE_CHECKING, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.experimental.shard_alike import shard_alike
from jax.sharding import NamedSharding
from jaxtyping import Array, Float, Int32, PyTree

from .._adam.adam import AdamW
from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer, child_update, scalar_hyperparams
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._filter_spec import resolve_spec, select
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    is_none,
    is_param,
    mask_field,
    out_dtype,
    pack,
    real_dtype,
    resolve,
    scalar,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import (
    dtype_of,
    new_buffer,
    plain_dtype,
    read,
    storage_of,
    Stored,
    write,
)
from .linalg import (
    check_dimension_numbers,
    matrix_view,
    MatrixView,
    newton_schulz as _newton_schulz,
)
from .spread import (
    check_spread,
    explicit_sharding,
    find_spread,
    gathered,
    mesh_of,
    replicate,
    Spread,
    spread_field,
    spread_map,
)


# Abstract fields: type checkers see a `ClassVar` (as equinox does for its
# `AbstractClassVar`), so that their model of a final class's `__init__` takes its
# fields, in Optax's order, from the final class alone, as equinox does at run time.
if TYPE_CHECKING:
    from typing import ClassVar as AbstractVar
else:
    from equinox import AbstractVar


_SCALE_RULES = ("reference", "adamw_rms")
# Whether same-shape matrices are stacked and orthogonalized by one batched
# Newton-Schulz: `None` (default) batches them on accelerators, where one batched
# matmul replaces many small kernel launches, and not on CPU, where XLA's batched
# matmul measured slower than separate multithreaded ones (benchmarks/muon.py; 24
# matrices of 256x1024: 0.54 s batched, 0.41 s separate). Module-level so that the
# benchmark can force either.
_GROUP_SAME_SHAPES: bool | None = None


def _group_same_shapes() -> bool:
    if _GROUP_SAME_SHAPES is None:
        return jax.default_backend() != "cpu"
    return _GROUP_SAME_SHAPES


# The Polar Express schedule (Amsel, Persson, Musco & Gower 2025) as modded-nanogpt
# uses it: 5 steps "computed for num_iters=5, safety_factor=2e-2, cushion=2", run on
# X / (1.02 ||X||_F + 1e-6). The 1.02 of that normalization is folded into the first
# triple (a / s, b / s^3, c / s^5 with s = 1.02: p(X / s) = p_s(X)), so that Muon's
# own X / (||X||_F + eps) normalization gives the reference's iterates.
_PE_SAFETY = 1.02
_PE_TABLE = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


class _Coefficients(tuple):
    r"""The Polar Express coefficients (Amsel, Persson, Musco & Gower 2025): 5 triples
    $(a_i, b_i, c_i)$, one per Newton-Schulz step, for `Muon(ns_coeffs=...)` and
    `NorMuon(ns_coeffs=...)` (with the default `ns_steps=5`).

    They are modded-nanogpt's table ("computed for num_iters=5, safety_factor=2e-2,
    cushion=2"), which it runs on $X / (1.02\,\|X\|_F + 10^{-6})$; the factor 1.02 is
    folded into the first triple ($a/1.02$, $b/1.02^3$, $c/1.02^5$: the same
    polynomial of $X/1.02$), so that Muon's normalization $X / (\|X\|_F + \epsilon)$
    gives modded-nanogpt's iterates (exactly with `eps=1e-6 / 1.02`; the default
    `eps=1e-7` differs from it by about $10^{-7}/\|X\|_F$ relative). A plain tuple of
    tuples of floats.

    ??? cite "References"

        ```bibtex
        @article{amsel2025polar,
            title={The {Polar Express}: Optimal Matrix Sign Methods and Their
                Application to the {Muon} Algorithm},
            author={Amsel, Noah and Persson, David and Musco, Christopher
                and Gower, Robert M.},
            journal={arXiv:2505.16932}, year={2025}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        assert len(eqxopt.POLAR_EXPRESS_COEFFS) == 5
        opt = eqxopt.Muon(0.02, ns_coeffs=eqxopt.POLAR_EXPRESS_COEFFS)
        params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(4)}
        state = opt.init(params)
        assert state.ns_coeffs.shape == (5, 3)
        ```
    """

    __slots__ = ()


POLAR_EXPRESS_COEFFS = _Coefficients(
    (
        (
            _PE_TABLE[0][0] / _PE_SAFETY,
            _PE_TABLE[0][1] / _PE_SAFETY**3,
            _PE_TABLE[0][2] / _PE_SAFETY**5,
        ),
    )
    + _PE_TABLE[1:]
)


@dataclasses.dataclass(frozen=True)
class MuonDimensionNumbers:
    """Which axes of a weight make up the matrix that Muon orthogonalizes.

    The weight is viewed as a stack of matrices of shape `(out, in)`: the
    `output_axis` axes (flattened together, in order) give the rows, the
    `reduction_axis` axes (the axes a matrix-vector product sums over) the columns,
    and every other axis is a batch axis, orthogonalized independently. Negative axes
    count from the end.

    The defaults, `reduction_axis=-1, output_axis=-2`, describe Equinox's (and
    PyTorch's) `(..., out, in)` layout: `eqx.nn.Linear(3, 5).weight.shape == (5, 3)`.
    This is the transpose of `optax.contrib.MuonDimensionNumbers`' defaults (`0` and
    `1`, Flax's `(in, out)` kernels); the field names and their meaning are the same.

    !!! Example

        ```python
        import equinox as eqx
        import jax.numpy as jnp

        import eqxopt

        # An `eqx.nn.Conv2d` kernel (out, in, kh, kw) as one (out, in*kh*kw)
        # matrix, as the reference implementation flattens conv filters:
        conv = eqxopt.MuonDimensionNumbers(reduction_axis=(1, 2, 3), output_axis=0)
        params = {"conv": jnp.ones((8, 3, 3, 3)), "b": jnp.zeros(8)}
        opt = eqxopt.Muon(0.02, matrix_mask={"conv": conv, "b": False})
        state = opt.init(params)  # "b" goes to the fallback, AdamW
        ```
    """

    reduction_axis: int | tuple[int, ...] = -1
    output_axis: int | tuple[int, ...] = -2

    def __post_init__(self):
        check_dimension_numbers(self)


@dataclasses.dataclass(frozen=True)
class _MuonView(MatrixView):
    """A Muon leaf's `(batch, out, in)` view, which also knows its reduction axes (for
    NorMuon's row statistics)."""

    red: tuple[int, ...] = ()

    @property
    def rows(self) -> MatrixView:
        """The view of a row-statistics buffer: the leaf's shape with its reduction
        axes set to 1, seen as `(batch, out, 1)`."""
        shape = tuple(1 if a in self.red else d for a, d in enumerate(self.shape))
        b, n_out, _ = self.view_shape
        return MatrixView(shape, (b, n_out, 1), self.preconditioned, self.perm)


def _as_matrix(value, p, where: str) -> _MuonView | None:
    """Interpret the `matrix_mask` value for one param leaf."""
    if value is None or value is False:
        return None
    if isinstance(value, (np.bool_, np.ndarray)) and np.ndim(value) == 0:
        value = bool(value)
        if not value:
            return None
    if value is True:
        dims = MuonDimensionNumbers()
    elif isinstance(value, MuonDimensionNumbers):
        dims = value
    else:
        raise ValueError(
            f"`Muon(matrix_mask=...)` must give each param a Python bool or a "
            f"`MuonDimensionNumbers`, got {value!r} for the leaf at `{where}`."
        )
    ndim = p.ndim
    if ndim < 2:
        raise ValueError(
            f"`Muon(matrix_mask=...)` selected the leaf at `{where}` of shape "
            f"{p.shape}, but Muon needs an array of rank >= 2; route it to the "
            "fallback."
        )

    def norm(axes, name):
        axes = (axes,) if isinstance(axes, int) else axes
        if not all(-ndim <= a < ndim for a in axes):
            raise ValueError(
                f"`MuonDimensionNumbers({name}={axes})` is out of range for the leaf "
                f"at `{where}` of shape {p.shape}."
            )
        out = tuple(a % ndim for a in axes)
        if len(set(out)) != len(out):
            raise ValueError(
                f"`MuonDimensionNumbers({name}=...)` repeats an axis: {axes}."
            )
        return out

    red = norm(dims.reduction_axis, "reduction_axis")
    out = norm(dims.output_axis, "output_axis")
    if set(red) & set(out):
        raise ValueError(
            f"`MuonDimensionNumbers` axes must be disjoint, got reduction_axis={red} "
            f"and output_axis={out} for the leaf at `{where}` of shape {p.shape}."
        )
    view = matrix_view(p.shape, dimension_numbers=(red, out))
    return _MuonView(**dataclasses.asdict(view), red=red)


def _default_mask(p) -> bool:
    return p.ndim == 2


def _orthogonalize(
    inputs: list,
    matrices: list[MatrixView],
    coeffs,
    eps,
    ns_dtype,
    spread: Spread | None,
):
    """Newton-Schulz on every leaf of `inputs`, through `spread_map`: same-shape
    matrices share one batch (on accelerators, see `_GROUP_SAME_SHAPES`, and always
    when `spread` splits the batches over the devices of a mesh), tall ones
    transposed so that they batch with their wide transposes. Unbatched (on CPU),
    a tall matrix is iterated as it is, which compiles faster: the transposes would be
    copies, and each shape's copy is a kernel of its own."""
    group = _group_same_shapes()
    batch = group or spread is not None
    stacks, transposed, shardings = [], [], []
    originals = list(inputs)
    for x, mat in zip(inputs, matrices):
        # Explicitly sharded leaves are gathered for the iteration (whose matmuls
        # would otherwise need an output sharding) and re-sharded afterwards.
        shardings.append(explicit_sharding(x))
        x = gathered(x)
        s = mat.to_view(x)
        tall = batch and s.shape[-2] > s.shape[-1]
        stacks.append(jnp.swapaxes(s, -1, -2) if tall else s)
        transposed.append(tall)
    results = spread_map(
        lambda _, shared, x: _newton_schulz(x, shared[0], shared[1], ns_dtype),
        [(None, (s,)) for s in stacks],
        spread,
        shared=(coeffs, eps),
        batched=True,
        group=group,
    )
    outputs = []
    for o, t, mat, sharding, x in zip(
        results, transposed, matrices, shardings, originals
    ):
        o = mat.from_view(jnp.swapaxes(o, -1, -2) if t else o)
        if sharding is not None:
            o = jax.sharding.reshard(o, sharding)
        elif spread is not None:
            # Spread work comes back replicated (gathered); the update is sharded
            # as its input, which is sharded as the param. Behind a barrier, so
            # that XLA's propagation does not carry it into the spread work.
            _, o = shard_alike(x, jax.lax.optimization_barrier(o))
        outputs.append(o)
    return outputs


class _Input:
    """A Muon leaf's Newton-Schulz input and its matrix view (a single tree leaf)."""

    __slots__ = ("value", "matrix")

    def __init__(self, value, matrix: MatrixView):
        self.value = value
        self.matrix = matrix


def _is_input(x) -> bool:
    return x is None or isinstance(x, _Input)


@typechecked
class MuonState(eqx.Module):
    """State of [`eqxopt.Muon`][]: the step count, the momentum buffers (`mu`, a leaf
    per Muon leaf, `None` elsewhere; [`eqxopt.QuantizedArray`][]s with a quantized
    `state_dtype`), the Newton-Schulz coefficients (one `(a, b, c)` row per
    iteration), and the fallback optimizer's state.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        opt = eqxopt.Muon(0.02)
        state = opt.init(params)
        assert state.mu["w"].shape == (2, 3) and state.mu["b"] is None
        assert state.ns_coeffs.shape == (5, 3)  # (a, b, c) per Newton-Schulz step
        state.fallback_state  # AdamW's state, for "b"
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Stored]
    ns_coeffs: Float[Array, "ns_steps 3"]
    fallback_state: PyTree[Any]


def _to_coeffs(value):
    """Nested Python sequences of numbers become nested tuples of floats (hashable, no
    arrays); anything else (arrays, malformed input) is left to `__check_init__`."""
    if isinstance(value, (list, tuple)):
        try:
            arr = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            return value
        if arr.ndim == 1:
            return tuple(float(v) for v in arr)
        if arr.ndim == 2:
            return tuple(tuple(float(v) for v in row) for row in arr)
    return value


@typechecked
class NorMuonState(eqx.Module):
    """State of [`eqxopt.NorMuon`][]: as [`eqxopt.MuonState`][], plus `nu`, the
    row-wise second moments: for a Muon leaf of shape `(out, in)`, an `(out, 1)` buffer
    (the leaf's shape with its reduction axes set to 1), `None` elsewhere.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.NorMuon(0.02).init(params)
        assert state.mu["w"].shape == (2, 3) and state.nu["w"].shape == (2, 1)
        assert state.nu["b"] is None  # "b" goes to the fallback, AdamW
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Stored]
    nu: PyTree[Float[Array, "..."]]
    ns_coeffs: Float[Array, "ns_steps 3"]
    fallback_state: PyTree[Any]


_State = TypeVar("_State", MuonState, NorMuonState)


class _AbstractMuon(AbstractOptimizer[_State], Generic[_State]):
    """Muon's body, shared by [`eqxopt.Muon`][] and [`eqxopt.NorMuon`][]: routing,
    momentum, Newton-Schulz, the shape factor, weight decay and the fallback. A final
    class gives its fields, its state class (`_make_state`) and, for NorMuon, the
    row-wise normalization (`_normalize`)."""

    learning_rate: AbstractVar[ScalarOrSchedule]
    momentum: AbstractVar[ScalarLike]
    nesterov: AbstractVar[bool]
    ns_steps: AbstractVar[int]
    ns_coeffs: AbstractVar[Any]
    eps: AbstractVar[ScalarLike]
    weight_decay: AbstractVar[ScalarOrSchedule]
    fallback: AbstractVar[AbstractOptimizer | None]
    scale_rule: AbstractVar[str]
    ns_dtype: AbstractVar[Any]
    matrix_mask: AbstractVar[FilterSpec | None]
    state_dtype: AbstractVar[Any]
    spread: AbstractVar[bool | str | tuple[str, ...]]

    # The momentum mirrors the Muon leaves (NorMuon's row moments mirror no param).
    _state_buffers = {"mu": False}

    def __check_init__(self):
        name = type(self).__name__
        check_spread(self)
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "eps", "weight_decay"),
            unit_interval=("momentum",),
            positive_int=("ns_steps",),
            choices={"scale_rule": _SCALE_RULES},
        )
        try:
            shape = np.shape(self.ns_coeffs)
        except ValueError:
            shape = None
        if shape != (3,) and shape != (self.ns_steps, 3):
            raise ValueError(
                f"`{name}(ns_coeffs=...)` must be one triple (a, b, c) or a sequence "
                f"of `ns_steps`={self.ns_steps} triples, got "
                + (f"shape {shape}." if shape is not None else f"{self.ns_coeffs!r}.")
            )
        if self.fallback is not None and not isinstance(
            self.fallback, AbstractOptimizer
        ):
            raise ValueError(
                f"`{name}(fallback=...)` must be an eqxopt optimizer (or `None` for "
                f"AdamW), got {type(self.fallback).__name__}."
            )
        try:
            ns_float = self.ns_dtype is None or jnp.issubdtype(
                self.ns_dtype, jnp.floating
            )
        except TypeError:
            ns_float = False
        if not ns_float:
            raise ValueError(
                f"`{name}(ns_dtype=...)` must be a floating dtype such as "
                f"`jnp.bfloat16`, or None, got {self.ns_dtype!r}."
            )

    # -- what differs between Muon and NorMuon ---------------------------------------

    def _make_state(self, count, mu, nu, ns_coeffs, fallback_state) -> _State:
        raise NotImplementedError

    def _nu(self, state: _State):
        """The row statistics in `state` (`None` for Muon)."""
        return None

    def _normalize(self, o, nu, view: _MuonView, dtype):
        """`(o, nu)` after the row-wise normalization; Muon leaves both alone."""
        return o, nu

    # -- routing ---------------------------------------------------------------------

    def _fallback(self) -> AbstractOptimizer:
        if self.fallback is not None:
            return self.fallback
        return AdamW(
            self.learning_rate,
            weight_decay=self.weight_decay,
            state_dtype=self.state_dtype,
        )

    def _route(self, params) -> tuple[Any, Any]:
        """`(views, fallback_mask)`: a tree of params' structure holding one
        `MatrixView` per Muon leaf (`None` elsewhere), and the mask of the fallback's
        leaves (`True`/`False` per param leaf, `None` elsewhere), as
        [`eqxopt.Partition`][] resolves its labels."""
        spec = _default_mask if self.matrix_mask is None else self.matrix_mask
        resolved = resolve_spec(
            spec, params, what=f"`{type(self).__name__}(matrix_mask=...)`"
        )
        leaves_with_path, treedef = jtu.tree_flatten_with_path(params, is_leaf=is_none)
        values = treedef.flatten_up_to(resolved)
        views = [
            _as_matrix(v, p, jtu.keystr(path)) if is_param(p) else None
            for (path, p), v in zip(leaves_with_path, values)
        ]
        mask = [
            (view is None) if is_param(p) else None
            for (_, p), view in zip(leaves_with_path, views)
        ]
        return jtu.tree_unflatten(treedef, views), jtu.tree_unflatten(treedef, mask)

    # -- protocol --------------------------------------------------------------------

    def init(self, params: Params) -> _State:
        leaves, treedef = jtu.tree_flatten(params, is_leaf=is_none)
        view_tree, fb_mask = self._route(params)
        views = treedef.flatten_up_to(view_tree)
        storage = storage_of(self.state_dtype, "mu")
        mu = [
            None if v is None else new_buffer(p, 0, storage, False)
            for p, v in zip(leaves, views)
        ]
        # The row moments mirror no param: a dtype `state_dtype` only.
        plain = plain_dtype(self.state_dtype)
        nu = [
            None if v is None else jnp.zeros(v.rows.shape, real_dtype(plain or p.dtype))
            for p, v in zip(leaves, views)
        ]
        # The coefficients are stored no wider than the widest Muon param (or
        # `state_dtype`): API rule 8. They are cast to the iteration's dtype when used.
        dtypes = [p.dtype for p, v in zip(leaves, views) if v is not None]
        dtypes = dtypes or [p.dtype for p in leaves if is_param(p)]
        dtypes += [] if plain is None else [jnp.dtype(plain)]
        if dtypes:
            with jax.numpy_dtype_promotion("standard"):
                dtype = real_dtype(jnp.result_type(*dtypes))
        else:
            dtype = jnp.dtype(jnp.float32)
        coeffs = jnp.asarray(self.ns_coeffs, dtype)
        coeffs = jnp.broadcast_to(coeffs, (self.ns_steps, 3))
        return self._make_state(
            zero_count(),
            jtu.tree_unflatten(treedef, mu),
            jtu.tree_unflatten(treedef, nu),
            coeffs,
            self._fallback().init(select(params, fb_mask)),
        )

    def update(self, grads: Updates, state: _State, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)
        wd = resolve(self.weight_decay, state.count)
        decays = not (isinstance(wd, (int, float)) and wd == 0)
        if params is None and (decays or self.fallback is None):
            raise ValueError(
                f"`{type(self).__name__}.update` needs `params` (for the weight decay, "
                "and for its default fallback, AdamW)."
            )
        # Route: which leaves are Muon's matrices, which go to the fallback.
        views, fb_mask = self._route(grads if params is None else params)
        mu, inputs = self._momentum(grads, state, views)
        ortho = self._orthogonalize_all(inputs, state.ns_coeffs)
        muon_updates, nu = self._finish(grads, ortho, params, state, views, lr, wd)
        updates, fb_state = self._merge_fallback(
            muon_updates, grads, params, state, fb_mask, extra
        )
        # The row moments (NorMuon) are replicated over the params' mesh, as
        # `state_shardings` predicts (XLA would otherwise pick their shardings).
        inputs = [
            x.value for x in jtu.tree_leaves(inputs, is_leaf=_is_input) if x is not None
        ]
        nu = replicate(nu, mesh_of(inputs))
        new_state = self._make_state(
            increment(state.count), mu, nu, state.ns_coeffs, fb_state
        )
        return updates, new_state

    # -- the steps of `update` -------------------------------------------------------

    def _momentum(self, grads, state: _State, views):
        """The new momentum buffers, and per Muon leaf the input of Newton-Schulz
        (`None` at the fallback's leaves): `m = momentum * m + (1 - momentum) * g`,
        and with Nesterov `(1 - momentum) * g + momentum * m`."""
        name = type(self).__name__

        def leaf(g, m, view):
            if (view is None) != (m is None):
                raise ValueError(
                    f"eqxopt: `{name}(matrix_mask=...)` selects different leaves than "
                    "when the state was initialized; re-run `init`."
                )
            if view is None:
                return pack(None, None)
            dtype = compute_dtype(g.dtype, dtype_of(m))
            mom = scalar(self.momentum, dtype)
            g32 = g.astype(dtype)
            m32 = mom * read(m, dtype) + (1 - mom) * g32
            v = (1 - mom) * g32 + mom * m32 if self.nesterov else m32
            return pack(write(m32, m), _Input(v, view))

        names = ("grads", "state.mu", "matrix_mask")
        return tree_map_unzip(leaf, 2, grads, state.mu, views, names=names)

    def _orthogonalize_all(self, inputs, ns_coeffs):
        """Newton-Schulz on every Muon leaf at once (same shapes share one batch,
        spread over the params' mesh); `None` at the fallback's leaves."""
        leaves = [
            x for x in jtu.tree_leaves(inputs, is_leaf=_is_input) if x is not None
        ]
        values = [x.value for x in leaves]
        spread = find_spread(self.spread, values, type(self).__name__)
        ortho = iter(
            _orthogonalize(
                values,
                [x.matrix for x in leaves],
                ns_coeffs,
                self.eps,
                self.ns_dtype,
                spread,
            )
        )
        return jtu.tree_map(
            lambda x: None if x is None else next(ortho), inputs, is_leaf=_is_input
        )

    def _finish(self, grads, ortho, params, state: _State, views, lr, wd):
        """Per Muon leaf: NorMuon's row normalisation, the shape factor of
        `scale_rule`, decoupled weight decay and `-lr`; with the new row moments."""
        decays = not (isinstance(wd, (int, float)) and wd == 0)

        def leaf(g, o, p, nu, view):
            if view is None:
                return pack(None, None)
            _, n_out, n_in = view.view_shape
            if self.scale_rule == "reference":
                s = math.sqrt(max(1.0, n_out / max(n_in, 1)))
            else:
                s = 0.2 * math.sqrt(max(n_out, n_in))
            dtype = o.dtype
            o, nu = self._normalize(o, nu, view, dtype)
            direction = scalar(s, dtype) * o
            if decays:
                direction = direction + scalar(wd, dtype) * p.astype(dtype)
            update = (-scalar(lr, dtype) * direction).astype(out_dtype(g, p))
            return pack(update, nu)

        names = ("grads", "ortho", "params", "row moments (state.nu)", "matrix_mask")
        trees = (grads, ortho, params, self._nu(state), views)
        return tree_map_unzip(leaf, 2, *trees, names=names)

    def _merge_fallback(self, muon_updates, grads, params, state: _State, mask, extra):
        """The fallback's updates (it sees `None` at Muon leaves) merged with Muon's,
        and its new state. With no fallback leaf at all (e.g. params that are one
        matrix), it is not called."""
        if not any(m is True for m in jtu.tree_leaves(mask)):
            return muon_updates, state.fallback_state
        fb_updates, fb_state = child_update(
            self._fallback(),
            ".fallback_state",
            select(grads, mask),
            state.fallback_state,
            None if params is None else select(params, mask),
            **extra,
        )
        updates = jtu.tree_map(
            lambda a, b: b if a is None else a,
            muon_updates,
            fb_updates,
            is_leaf=is_none,
        )
        return updates, fb_state

    def hyperparams(self, state: _State) -> dict[str, Any]:
        out = scalar_hyperparams(self, state.count)
        out["fallback"] = self._fallback().hyperparams(state.fallback_state)
        return out


class Muon(_AbstractMuon[MuonState]):
    r"""Muon: SGD-momentum whose update for each weight matrix is orthogonalized by a
    Newton-Schulz iteration; every other leaf is optimized by `fallback` (AdamW).

    For a matrix leaf $W$ of shape `(out, in)` with gradient $G_k$:

    $$M_k = \mu\, M_{k-1} + (1-\mu)\, G_k, \qquad
      V_k = \begin{cases} (1-\mu)\, G_k + \mu\, M_k & \text{nesterov} \\
      M_k & \text{otherwise} \end{cases}$$

    $$X_0 = \frac{V_k}{\|V_k\|_F + \epsilon}, \qquad
      X_{i+1} = a_i X_i + \left(b_i A_i + c_i A_i^2\right) X_i,\quad
      A_i = X_i X_i^\top \qquad (i < \texttt{ns\_steps})$$

    $$u_k = -\eta_k \left(s\, X_{\texttt{ns\_steps}} + \lambda_k W_k\right)$$

    (for a tall $X$, `out > in`, the same function with $A_i = X_i^\top X_i$ and
    $X_{i+1} = a_i X_i + X_i (b_i A_i + c_i A_i^2)$, which is cheaper). The quintic
    pushes every singular value of $X_0$ towards 1 (into about
    $[0.5, 1.5]$, which the reference found harmless):
    $X_{\texttt{ns\_steps}} \approx U V^\top$ for $V_k = U S V^\top$.
    The shape factor $s$ is

    - `scale_rule="reference"`: $s = \sqrt{\max(1, \texttt{out}/\texttt{in})}$
      (Keller Jordan's Muon);
    - `scale_rule="adamw_rms"`: $s = 0.2\sqrt{\max(\texttt{out}, \texttt{in})}$, which
      gives the update the RMS of a typical AdamW update (Moonlight), so AdamW's
      learning rate and weight decay carry over.

    `out` and `in` follow Equinox's `(out, in)` layout (`shape[-2]`, `shape[-1]`), or
    the products of the axes a [`eqxopt.MuonDimensionNumbers`][] names.

    **Defaults' provenance and differences from the reference**
    ([KellerJordan/Muon](https://github.com/KellerJordan/Muon)):
    the momentum has no bias correction; Nesterov uses `grad.lerp(momentum, mu)`;
    Newton-Schulz runs on $V / (\|V\|_F + 10^{-7})$ with
    $(a, b, c) = (3.4445, -4.7750, 2.0315)$ for 5 steps, on tall matrices transposed
    (or, here on CPU, in the equivalent tall form);
    the update is $-\eta(s\,O + \lambda W)$, as the reference's
    `p.mul_(1 - lr * wd); p.add_(O * s, alpha=-lr)`. Two deliberate differences: the
    reference runs Newton-Schulz in bfloat16 (here: in the params' compute dtype,
    float32 or wider, unless `ns_dtype=jnp.bfloat16`), and for 4-D conv kernels it
    flattens `(out, in, h, w)` to `(out, in*h*w)` but takes $s$ from the kernel's last
    two axes `h/w` (here: from the flattened matrix, `out/(in*h*w)`).

    **Newton-Schulz coefficients.** `ns_coeffs` takes one triple or `ns_steps` triples;
    [`eqxopt.POLAR_EXPRESS_COEFFS`][] is the Polar Express schedule (Amsel et al.
    2025) as modded-nanogpt runs it (5 steps, safety factor 0.02), with its
    $X / (1.02\|X\|_F + 10^{-6})$ normalization folded into the first triple, so
    `Muon(lr, ns_coeffs=eqxopt.POLAR_EXPRESS_COEFFS)` reproduces modded-nanogpt's
    `polar_express` (up to `eps`: `eps=1e-6 / 1.02` matches it exactly).

    **State memory** per `(m, n)` Muon leaf: $mn$ elements (the momentum `mu`) in the
    param's dtype (or `state_dtype`); plus, once, the `int32` count, the
    `(ns_steps, 3)` coefficients (in the widest Muon param's dtype, or
    `state_dtype` if wider), and the fallback's state for the other leaves.

    **Compared with `optax.contrib.muon`** (0.2.8):

    - Optax bias-corrects the momentum. Without Nesterov this only rescales $V$ and the
      Frobenius normalization removes it (both agree up to `eps`); with Nesterov its
      look-ahead $\mu\hat M_k + (1-\mu)\hat G_k$ weights the two terms differently from
      the reference's, so the two differ.
    - Optax's dimension numbers default to Flax's `(in, out)` layout, so on Equinox
      weights its default scale is $\sqrt{\max(1, \texttt{in}/\texttt{out})}$, the
      inverse; pass `MuonDimensionNumbers(reduction_axis=1, output_axis=0)` to it.
    - Optax's `eps` defaults to `1e-8` and is shared with its Adam; here `eps=1e-7`
      (the reference's) is Newton-Schulz's alone, and `fallback` has its own.
    - Optax's Adam takes Muon's `nesterov` and `adam_weight_decay=0`; the default
      `fallback` here is `AdamW(learning_rate, weight_decay=weight_decay)` with
      AdamW's own defaults (`nesterov=False`).
    - Optax accepts more coefficient triples than `ns_steps` (it uses the last
      `ns_steps`); here their number must equal `ns_steps`.
    - Optax builds its coefficient array in `init` (0.2.8; earlier versions did it at
      construction, which leaked a tracer when the optimizer was built under `jit` or
      `shard_map`). Here too: constructing `Muon` creates no JAX arrays.

    Embeddings, the output head, biases and gains should not use Muon (reference
    advice): by default only 2-D leaves are Muon leaves, and `matrix_mask` chooses
    otherwise (see the docs' "Routing" section).

    On GPU and TPU, same-shape matrices (tall ones transposed) are stacked and
    go through one batched Newton-Schulz; on CPU, where XLA's batched matmul is slower
    than separate ones, each leaf has its own. With `jit` and sharded params
    (`NamedSharding`), the momentum buffers come out sharded like the params, and the
    same-shape stacks are split over the mesh's devices, each orthogonalizing its
    share (`spread`). Inside
    `shard_map`, each device must see whole matrices (data parallelism: replicated
    params, `pmean`-ed grads).

    ??? cite "References"

        ```bibtex
        @misc{jordan2024muon,
            title={Muon: An optimizer for hidden layers in neural networks},
            author={Jordan, Keller and Jin, Yuchen and Boza, Vlado and You, Jiacheng
                and Cesista, Franz and Newhouse, Laker and Bernstein, Jeremy},
            year={2024},
            url={https://kellerjordan.github.io/posts/muon/}}

        @article{liu2025muon,
            title={Muon is Scalable for {LLM} Training},
            author={Liu, Jingyuan and Su, Jianlin and Yao, Xingcheng and others},
            journal={arXiv:2502.16982}, year={2025}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Muon(0.02, weight_decay=0.01)  # AdamW(0.02, ...) for the rest
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # "w" (a matrix) gets Muon's orthogonalized momentum, "b" AdamW
        ```
    """

    learning_rate: ScalarOrSchedule
    momentum: ScalarLike = 0.95
    nesterov: bool = eqx.field(default=True, static=True)
    ns_steps: int = eqx.field(default=5, static=True)
    ns_coeffs: Any = eqx.field(default=(3.4445, -4.7750, 2.0315), converter=_to_coeffs)
    eps: ScalarLike = 1e-7
    weight_decay: ScalarOrSchedule = 0.0
    fallback: AbstractOptimizer | None = None
    scale_rule: str = eqx.field(default="reference", static=True)
    ns_dtype: Any = eqx.field(default=None, static=True)
    matrix_mask: FilterSpec | None = mask_field(default=None)
    state_dtype: Any = eqx.field(default=None, static=True)
    spread: bool | str | tuple[str, ...] = spread_field()

    def _make_state(self, count, mu, nu, ns_coeffs, fallback_state) -> MuonState:
        del nu
        return MuonState(count, mu, ns_coeffs, fallback_state)


Muon.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`. Also
    the default fallback's learning rate.
- `momentum`: $\mu$ in `[0, 1)`; default `0.95`.
- `nesterov`: use the Nesterov look-ahead $(1-\mu) G_k + \mu M_k$ (default `True`).
    (Static.)
- `ns_steps`: number of Newton-Schulz iterations; default `5`. (Static.)
- `ns_coeffs`: one triple $(a, b, c)$ used at every iteration (default Keller
    Jordan's `(3.4445, -4.7750, 2.0315)`), or a sequence of `ns_steps` triples, one
    per iteration (e.g. [`eqxopt.POLAR_EXPRESS_COEFFS`][], or Dion's schedule).
    Stored in the state by `init`, as a `(ns_steps, 3)` array in the Muon params'
    dtype (or `state_dtype` if wider), so that no state leaf is wider than the
    params: for float16/bfloat16 params the coefficients are rounded to that dtype
    (`3.4445` becomes `3.4375` in bfloat16); pass `state_dtype=jnp.float32` to keep
    them exact.
- `eps`: $\epsilon$ in the Frobenius normalization; default `1e-7` (the reference's).
- `weight_decay`: $\lambda$, decoupled and multiplied by the learning rate; a number
    or a schedule; default `0.0`. Also the default fallback's weight decay.
- `fallback`: the optimizer for every leaf that is not a Muon leaf (it sees `None` at
    Muon leaves). Any eqxopt optimizer; default
    `eqxopt.AdamW(learning_rate, weight_decay=weight_decay)` with AdamW's own defaults
    (`b1=0.9, b2=0.999, eps=1e-8`) and this optimizer's `state_dtype`.
- `scale_rule`: `"reference"` ($\sqrt{\max(1, \texttt{out}/\texttt{in})}$, default)
    or `"adamw_rms"` ($0.2\sqrt{\max(\texttt{out}, \texttt{in})}$, Moonlight).
    (Static.)
- `ns_dtype`: run the Newton-Schulz iteration in this dtype (e.g. `jnp.bfloat16`, as
    the reference does); the result is cast back. Default: the compute dtype (float32,
    or float64 for float64 params). (Static.)
- `matrix_mask`: which leaves are Muon leaves, as a filter spec (a PyTree prefix of
    the params, or a per-leaf callable) whose values are `True`/`False` or an
    [`eqxopt.MuonDimensionNumbers`][] (for higher-rank weights). `True` on a leaf
    of rank > 2 orthogonalizes its last two axes `(out, in)`, batching over the
    others. Default: the 2-D leaves.
- `state_dtype`: dtype of the momentum buffers (and of the default fallback's
    moments); default the param's. An [`eqxopt.Quantized`][] (or a dict
    `{"mu": ...}`) quantizes the momentum, and is passed on to the default fallback;
    the coefficients then stay in the params' dtype. (Static.)
- `spread`: under `jit` with params on a mesh, how the devices share the per-matrix
    work (Newton-Schulz): `True` (default) stacks same-shape matrices and splits the
    stacks over every mesh axis (each device computes its share, the results are
    all-gathered); a mesh axis name or a tuple of names uses those axes; `False`
    repeats the work on every device. (Static.)
"""


class NorMuon(_AbstractMuon[NorMuonState]):
    r"""NorMuon: Muon whose orthogonalized update is normalized neuron by neuron (row
    by row, in Equinox's `(out, in)` layout) by a running second moment, then rescaled
    to keep its Frobenius norm (Li et al. 2025).

    For a matrix leaf $W$ of shape `(out, in)`, with $O_k$ the orthogonalized
    momentum of [`eqxopt.Muon`][] (same momentum, Nesterov look-ahead and
    Newton-Schulz):

    $$v_k = \beta_2 v_{k-1} + (1-\beta_2)\,\operatorname{mean}_j\,(O_k)_{ij}^2
      \qquad (v_k \in \mathbb{R}^{\texttt{out} \times 1})$$

    $$\tilde O_k = \frac{O_k}{\sqrt{v_k} + \epsilon_2}, \qquad
      \hat O_k = \tilde O_k\,\frac{\|O_k\|_F}{\|\tilde O_k\|_F + \epsilon_2}, \qquad
      u_k = -\eta_k\left(s\,\hat O_k + \lambda_k W_k\right)$$

    with $s$ Muon's shape factor (`scale_rule`) and $\epsilon_2$ = `norm_eps`. The
    second moment has no bias correction, and each row of the update is divided by
    the root of its own running mean square, so that every output neuron gets a
    comparable step; the rescaling keeps Muon's update norm. Leaves of rank > 2
    (through [`eqxopt.MuonDimensionNumbers`][]) are normalized per row of each
    matrix of the batch, the reduction axes being the "columns".

    Routing, options and the fallback are [`eqxopt.Muon`][]'s: 2-D leaves (or those
    `matrix_mask` selects) are NorMuon leaves, every other leaf goes to `fallback`,
    by default `AdamW(learning_rate, weight_decay=weight_decay)`.

    **Defaults' provenance** ([zichongli5/NorMuon](https://github.com/zichongli5/NorMuon),
    `normuon.py`): `learning_rate=0.02` (the reference's `lr`), `momentum=0.95`,
    `beta2=0.95`, `weight_decay=0`, Nesterov, Keller Jordan's Newton-Schulz
    (5 steps of `(3.4445, -4.7750, 2.0315)`, `eps=1e-7`), `norm_eps=1e-10` (both
    `1e-10`s of `normuon_update`), the reference scale
    $\sqrt{\max(1, \texttt{out}/\texttt{in})}$, and weight decay decoupled and
    multiplied by the learning rate (`p.mul_(1 - lr * wd)`).

    **Differences from the reference:**

    - The reference runs Newton-Schulz in bfloat16 (here: the params' compute
      dtype, float32 or wider, unless `ns_dtype=jnp.bfloat16`), and its buffers are
      in the param's dtype with in-place arithmetic in that dtype (here: stored in the
      param's dtype or `state_dtype`, computed in float32 or wider).
    - For 4-D conv kernels the reference orthogonalizes `(out, in*h*w)` but reshapes
      back before the normalization, so its "rows" are the `(out, in, h)` fibres along
      the kernel's last axis `w`, and its scale uses `h/w`. Here the rows are the
      output neurons of the flattened matrix (the axes a `MuonDimensionNumbers` names)
      and the scale uses `out/(in*h*w)`.
    - The reference skips weight decay for a param without a gradient (`had_grad`);
      here every param has a gradient (JAX gives zeros).
    - The reference's `NorMuonWithAuxAdam` uses Adam (`lr=3e-4`, `betas=(0.9, 0.95)`,
      `eps=1e-10`) for the other params; the default `fallback` here is Muon's,
      `AdamW(learning_rate, weight_decay=weight_decay)` with AdamW's defaults. Pass
      `fallback=eqxopt.AdamW(3e-4, b2=0.95, eps=1e-10, weight_decay=0.0)` for the
      reference's.

    **State memory** per `(m, n)` NorMuon leaf: $mn + m$ elements in the param's dtype
    (or `state_dtype`): the momentum `mu` and the row moments `nu`; plus, once, the
    `int32` count and the `(ns_steps, 3)` coefficients (as Muon's), and the
    fallback's state.

    ??? cite "References"

        ```bibtex
        @article{li2025normuon,
            title={{NorMuon}: Making {Muon} more efficient and scalable},
            author={Li, Zichong and Liu, Liming and Liang, Chen and Chen, Weizhu
                and Zhao, Tuo},
            journal={arXiv:2510.05491}, year={2025}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(4)}
        grads = {"w": jnp.arange(12.0).reshape(4, 3), "b": jnp.ones(4)}
        opt = eqxopt.NorMuon(0.02, weight_decay=0.01)  # AdamW(0.02, ...) for "b"
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert state.nu["w"].shape == (4, 1)  # one second moment per output neuron
        ```
    """

    learning_rate: ScalarOrSchedule = 0.02
    momentum: ScalarLike = 0.95
    beta2: ScalarLike = 0.95
    nesterov: bool = eqx.field(default=True, static=True)
    ns_steps: int = eqx.field(default=5, static=True)
    ns_coeffs: Any = eqx.field(default=(3.4445, -4.7750, 2.0315), converter=_to_coeffs)
    eps: ScalarLike = 1e-7
    norm_eps: ScalarLike = 1e-10
    weight_decay: ScalarOrSchedule = 0.0
    fallback: AbstractOptimizer | None = None
    scale_rule: str = eqx.field(default="reference", static=True)
    ns_dtype: Any = eqx.field(default=None, static=True)
    matrix_mask: FilterSpec | None = mask_field(default=None)
    state_dtype: Any = eqx.field(default=None, static=True)
    spread: bool | str | tuple[str, ...] = spread_field()

    def __check_init__(self):
        check_hyperparams(self, unit_interval=("beta2",), nonnegative=("norm_eps",))

    def _make_state(self, count, mu, nu, ns_coeffs, fallback_state) -> NorMuonState:
        return NorMuonState(count, mu, nu, ns_coeffs, fallback_state)

    def _nu(self, state: NorMuonState):
        return state.nu

    def _normalize(self, o, nu, view: _MuonView, dtype):
        rows = view.rows
        x = view.to_view(o)  # (batch, out, in)
        frob = lambda y: jnp.sqrt(jnp.sum(abs_sq(y), axis=(-2, -1), keepdims=True))
        real = real_dtype(dtype)  # the row moments are real, also for complex o
        eps = scalar(self.norm_eps, real)
        beta2 = scalar(self.beta2, real)
        # (batch, out, 1); a row with no entries (an empty leaf) has mean square 0.
        n_in = scalar(max(x.shape[-1], 1), real)
        mean_sq = jnp.sum(abs_sq(x), axis=-1, keepdims=True) / n_in
        v = beta2 * rows.to_view(nu).astype(real) + (1 - beta2) * mean_sq
        y = x / (jnp.sqrt(v) + eps).astype(dtype)
        y = y * (frob(x) / (frob(y) + eps))
        nu_new = rows.from_view(v).astype(nu.dtype)
        # With explicit mesh axes `v` follows `o`'s sharding; keep `nu`'s own (rule 5).
        target = getattr(jax.typeof(nu), "sharding", None)
        if explicit_sharding(nu_new) is not None and isinstance(target, NamedSharding):
            nu_new = jax.sharding.reshard(nu_new, target)
        return view.from_view(y), nu_new


NorMuon.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule; default `0.02` (the
    reference's). Also the default fallback's learning rate.
- `momentum`: $\mu$ in `[0, 1)`; default `0.95`.
- `beta2`: $\beta_2$ in `[0, 1)`, the decay of the row-wise second moment; default
    `0.95` (the reference's).
- `nesterov`, `ns_steps`, `ns_coeffs`, `eps`, `weight_decay`, `fallback`,
    `scale_rule`, `ns_dtype`, `matrix_mask`: as for [`eqxopt.Muon`][] (same
    defaults); `ns_coeffs` also takes [`eqxopt.POLAR_EXPRESS_COEFFS`][].
- `norm_eps`: $\epsilon_2$, added to $\sqrt{v}$ and to the norm in the rescaling;
    default `1e-10` (the reference's).
- `state_dtype`: dtype of the momentum and row-moment buffers (and of the default
    fallback's moments); default the param's. An [`eqxopt.Quantized`][] (or a dict
    `{"mu": ...}`) quantizes the momentum as for [`eqxopt.Muon`][]; the row moments
    then stay in the params' dtype. (Static.)
- `spread`: as for [`eqxopt.Muon`][]. (Static.)
"""
