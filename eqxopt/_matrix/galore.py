"""GaLore: an inner optimizer run on low-rank projections of the matrix gradients,
with the projections refreshed from the gradient's SVD every few steps."""

import dataclasses
import math
from typing import Any, TYPE_CHECKING

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, Inexact, Int32, PyTree

from .._adam.adam import ScaleByAdam
from .._checks import check_hyperparams, need_params
from .._core.base import (
    AbstractOptimizer,
    check_optimizer,
    child_update,
    scalar_hyperparams,
)
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._filter_spec import decay_mask
from .._kernels import descent, is_zero
from .._misc import (
    compute_dtype,
    increment,
    is_none,
    is_param,
    mask_field,
    out_dtype,
    resolve,
    resolve_filter_spec,
    scalar,
    typechecked,
    zero_count,
)
from .linalg import (
    check_dimension_numbers,
    check_every_k,
    every_k,
    HIGHEST,
    MatrixView,
)


# Abstract fields: type checkers see a `ClassVar` (as equinox does for its
# `AbstractClassVar`), so that their model of a final class's `__init__` takes its
# fields, in Optax's order, from the final class alone, as equinox does at run time.
if TYPE_CHECKING:
    from typing import ClassVar as AbstractVar
else:
    from equinox import AbstractVar


@dataclasses.dataclass(frozen=True)
class GaLoreDimensionNumbers:
    """Which axes of a weight make up the matrix that GaLore projects.

    The weight is transposed so that the `reduction_axis` axes come first and the
    `output_axis` axes next, then reshaped to a `(reduction, output)` matrix (the
    products of the sizes of each group). Every axis must be named in exactly one of
    the two. Negative axes count from the end. Matches
    `optax.contrib.GaLoreDimensionNumbers` (same fields, same defaults).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        # attention weights (embed, heads, head_dim) as one (embed, heads*head_dim)
        # matrix; the bias is not projected
        dims = eqxopt.GaLoreDimensionNumbers(reduction_axis=0, output_axis=(1, 2))
        params = {"attn": jnp.ones((8, 2, 4)), "b": jnp.zeros(8)}
        spec = {"attn": dims, "b": None}  # a filter spec: a prefix of the params
        opt = eqxopt.GaLore(1e-2, rank=2, weight_dimension_numbers=spec)
        state = opt.init(params)
        assert state.projector["attn"].shape == (8, 2)
        assert state.projector["b"] is None
        ```
    """

    reduction_axis: int | tuple[int, ...] = 0
    output_axis: int | tuple[int, ...] = 1

    def __post_init__(self):
        check_dimension_numbers(self)


def _h(q):
    """The conjugate transpose of a projector (its transpose for real params)."""
    return jnp.conj(q).T


@typechecked
class GaLoreState(eqx.Module):
    """State of [`eqxopt.GaLore`][] and [`eqxopt.ScaleByGaLore`][]: the step count,
    the base optimizer's state (on the low-rank projections of the projected leaves,
    on the full gradient of the others), and one projection matrix per projected
    leaf (`None` at the others).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((6, 4)), "b": jnp.zeros(6)}
        state = eqxopt.GaLore(1e-2, rank=2).init(params)
        assert state.count == 0  # int32 step count
        assert state.projector["w"].shape == (6, 2)  # P, (m, r) as m >= n
        assert state.projector["b"] is None  # 1-D: not projected
        assert state.base_optimizer_state.mu["w"].shape == (2, 4)  # Adam on P^T G
        assert state.base_optimizer_state.mu["b"].shape == (6,)
        ```
    """

    count: Int32[Array, ""]
    base_optimizer_state: Any
    projector: PyTree[Inexact[Array, "_ _"] | None]


@dataclasses.dataclass(frozen=True)
class _View:
    """How one projected leaf is seen: its `(m, n)` matrix view, which side is
    projected, and the projection's rank."""

    matrix: MatrixView
    left: bool
    rank: int

    @property
    def projector_shape(self) -> tuple[int, int]:
        m, n = self.matrix.view_shape
        return (m, self.rank) if self.left else (n, self.rank)

    @property
    def proxy_shape(self) -> tuple[int, int]:
        m, n = self.matrix.view_shape
        return (self.rank, n) if self.left else (m, self.rank)


def _as_view(value, p, rank: int, where: str, skip_low_rank: bool) -> _View | None:
    """Interpret the `weight_dimension_numbers` value for one param leaf."""
    if value is None or value is False:
        return None
    if isinstance(value, (np.bool_, np.ndarray)) and np.ndim(value) == 0:
        value = bool(value)
        if not value:
            return None
    if value is True:
        dims = GaLoreDimensionNumbers()
    elif isinstance(value, GaLoreDimensionNumbers):
        dims = value
    else:
        raise ValueError(
            "`GaLore(weight_dimension_numbers=...)` must give each param a "
            f"`GaLoreDimensionNumbers`, a Python bool or None, got {value!r} for the "
            f"leaf at `{where}`."
        )
    ndim = p.ndim
    if ndim < 2:
        if skip_low_rank:
            return None
        raise ValueError(
            f"`GaLore(weight_dimension_numbers=...)` selected the leaf at `{where}` of "
            f"shape {p.shape}, but GaLore projects arrays of rank >= 2 only."
        )

    def norm(axes, name):
        axes = (axes,) if isinstance(axes, int) else axes
        if not all(-ndim <= a < ndim for a in axes):
            raise ValueError(
                f"`GaLoreDimensionNumbers({name}={axes})` is out of range for the "
                f"leaf at `{where}` of shape {p.shape}."
            )
        return tuple(a % ndim for a in axes)

    red = norm(dims.reduction_axis, "reduction_axis")
    out = norm(dims.output_axis, "output_axis")
    perm = red + out
    if sorted(perm) != list(range(ndim)):
        raise ValueError(
            f"`GaLoreDimensionNumbers` must name every axis exactly once, got "
            f"reduction_axis={red} and output_axis={out} for the leaf at `{where}` "
            f"of shape {p.shape}."
        )
    m = math.prod(p.shape[a] for a in red)
    n = math.prod(p.shape[a] for a in out)
    matrix = MatrixView(
        tuple(p.shape),
        (m, n),
        (True, True),
        None if perm == tuple(range(ndim)) else perm,
    )
    return _View(matrix, m >= n, min(rank, m, n))


class AbstractGaLore(AbstractOptimizer[GaLoreState]):
    """GaLore's projection, base optimizer and refresh, shared by
    [`eqxopt.ScaleByGaLore`][] and [`eqxopt.GaLore`][] (which adds the weight decay
    and the learning rate)."""

    rank: AbstractVar[int]
    update_proj_gap: AbstractVar[ScalarLike]
    scale: AbstractVar[ScalarLike]
    base_optimizer: AbstractVar[AbstractOptimizer | None]
    weight_dimension_numbers: AbstractVar[Any]
    state_dtype: AbstractVar[DTypeLike | None]

    def __check_init__(self):
        name = type(self).__name__
        if self.base_optimizer is not None:
            check_optimizer(name, "base_optimizer", self.base_optimizer)
        check_hyperparams(
            self,
            positive_int=("rank",),
            nonnegative=tuple(
                n for n in ("learning_rate", "weight_decay") if hasattr(self, n)
            ),
        )
        check_every_k(self, "update_proj_gap")

    @property
    def _base(self) -> AbstractOptimizer:
        if self.base_optimizer is None:
            return ScaleByAdam(state_dtype=self.state_dtype)
        return self.base_optimizer

    def _views(self, params) -> tuple[list, Any]:
        """One `_View` (projected) or `None` per leaf of `params`, in
        `jtu.tree_flatten(params, is_leaf=is_none)` order, and that treedef."""
        spec = self.weight_dimension_numbers
        single = spec is None or isinstance(spec, GaLoreDimensionNumbers)
        if spec is None:
            spec = True
        resolved = resolve_filter_spec(
            spec,
            params,
            what=f"`{type(self).__name__}(weight_dimension_numbers=...)`",
        )
        leaves, treedef = jtu.tree_flatten_with_path(params, is_leaf=is_none)
        values = treedef.flatten_up_to(resolved)
        # As Optax: by default only the 2-D leaves are projected, and one
        # `GaLoreDimensionNumbers` for every leaf applies to those of rank >= 2.
        views = [
            (
                None
                if not is_param(p)
                or (self.weight_dimension_numbers is None and p.ndim != 2)
                else _as_view(v, p, self.rank, jtu.keystr(path), single)
            )
            for (path, p), v in zip(leaves, values)
        ]
        return views, treedef

    def init(self, params: Params) -> GaLoreState:
        views, treedef = self._views(params)
        p_leaves = treedef.flatten_up_to(params)
        dtype = lambda p: self.state_dtype or p.dtype
        projector = [
            None if v is None else jnp.zeros(v.projector_shape, dtype(p))
            for p, v in zip(p_leaves, views)
        ]
        proxies = [
            p if v is None else jnp.zeros(v.proxy_shape, p.dtype)
            for p, v in zip(p_leaves, views)
        ]
        return GaLoreState(
            zero_count(),
            self._base.init(jtu.tree_unflatten(treedef, proxies)),
            jtu.tree_unflatten(treedef, projector),
        )

    def _finish(self, count: Array, params):
        """`(finish, mask)`: the learning rate and weight decay of `GaLore` (see
        `eqxopt._kernels.descent`), `(None, None)` for `ScaleByGaLore`."""
        learning_rate = getattr(self, "learning_rate", None)
        if learning_rate is None:
            return None, None
        lr = resolve(learning_rate, count)
        weight_decay = getattr(self, "weight_decay", 0.0)
        if is_zero(weight_decay):
            return descent(lr), None
        need_params(self, params, "for the weight decay")
        wd = resolve(weight_decay, count)
        return descent(lr, wd), decay_mask(getattr(self, "mask", None), params)

    def update(self, grads: Updates, state: GaLoreState, params=None, **extra):
        views, treedef = self._views(grads)
        g_leaves = treedef.flatten_up_to(grads)
        proj_leaves = treedef.flatten_up_to(state.projector)
        idx = [i for i, v in enumerate(views) if v is not None]

        def matrix(i):
            g = g_leaves[i]
            return views[i].matrix.to_view(g.astype(compute_dtype(g.dtype)))

        mats = [matrix(i) for i in idx]
        projs = [proj_leaves[i] for i in idx]

        def refresh(mats, projs):
            out = []
            for i, g2, old in zip(idx, mats, projs):
                view = views[i]
                u, _, vh = jnp.linalg.svd(g2, full_matrices=False)
                # Orthonormal columns: U_r, or V_r = (V^H)_r^H (conjugated for
                # complex params, where the projections use conjugate transposes).
                new = u[:, : view.rank] if view.left else _h(vh[: view.rank, :])
                out.append(new.astype(old.dtype))
            return out

        def keep(mats, projs):
            return list(projs)

        if idx:
            projs = every_k(
                state.count, self.update_proj_gap, refresh, keep, mats, projs
            )
        new_proj = list(proj_leaves)
        low = list(g_leaves)
        for i, g2, q in zip(idx, mats, projs):
            q = q.astype(g2.dtype)
            r = (
                jnp.matmul(_h(q), g2, precision=HIGHEST)
                if views[i].left
                else jnp.matmul(g2, q, precision=HIGHEST)
            )
            low[i] = r.astype(g_leaves[i].dtype)
            new_proj[i] = projs[idx.index(i)]
        low_updates, base_state = child_update(
            self._base,
            ".base_optimizer_state",
            jtu.tree_unflatten(treedef, low),
            state.base_optimizer_state,
            None,
            **extra,
        )
        u_leaves = treedef.flatten_up_to(low_updates)
        finish, mask = self._finish(state.count, params)
        p_leaves = [None] * len(g_leaves) if params is None else None
        if p_leaves is None:
            p_leaves = treedef.flatten_up_to(params)
        m_leaves = [None] * len(g_leaves) if mask is None else None
        if m_leaves is None:
            m_leaves = treedef.flatten_up_to(mask)
        out = []
        for i, (g, u, p, selected) in enumerate(
            zip(g_leaves, u_leaves, p_leaves, m_leaves)
        ):
            if not is_param(g):
                out.append(u)
                continue
            view = views[i]
            dtype = compute_dtype(g.dtype, u.dtype)
            d = u.astype(dtype)
            if view is not None:
                q = new_proj[i].astype(dtype)
                full = (
                    jnp.matmul(q, d, precision=HIGHEST)
                    if view.left
                    else jnp.matmul(d, _h(q), precision=HIGHEST)
                )
                # As Optax, `scale` multiplies the projected leaves' updates only.
                d = view.matrix.from_view(full) * scalar(self.scale, dtype)
            if finish is not None:
                d = finish(d, g, p, selected)
            out.append(d.astype(out_dtype(g, p)))
        return jtu.tree_unflatten(treedef, out), GaLoreState(
            increment(state.count), base_state, jtu.tree_unflatten(treedef, new_proj)
        )

    def hyperparams(self, state: GaLoreState) -> dict[str, Any]:
        hp = scalar_hyperparams(self, state.count)
        hp["base_optimizer"] = self._base.hyperparams(state.base_optimizer_state)
        return hp


class ScaleByGaLore(AbstractGaLore):
    r"""GaLore's low-rank projection around a base optimizer, without the learning
    rate. Matches `optax.contrib.scale_by_galore`.

    Each projected leaf's gradient, seen as an $m \times n$ matrix $G_k$, is
    projected onto $r' = \min(r, m, n)$ dimensions by $P_k$, the top-$r'$ left
    ($m \ge n$) or right ($m < n$) singular vectors of the gradient, recomputed by an
    SVD every `update_proj_gap` steps ($k \bmod T = 0$, the first step included)
    and kept in between:

    $$R_k = P_k^\top G_k \ (m \ge n), \qquad R_k = G_k P_k \ (m < n)$$

    The base optimizer (default [`eqxopt.ScaleByAdam`][]) runs on $R_k$ (its state
    is low-rank) and its update $N_k$ is projected back, $u_k = s\,P_k N_k$ or
    $s\,N_k P_k^\top$ ($s$ = `scale`). The other leaves' gradients go to the base
    optimizer unprojected, and its updates pass through (unscaled, as Optax).

    The base optimizer is called without params (it sees low-rank shapes), so it
    must be a gradient transformation such as `ScaleByAdam`, `ScaleByLion`, not
    `AdamW`; put weight decay and the learning rate in [`eqxopt.GaLore`][].

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((6, 4)), "b": jnp.zeros(6)}
        grads = {"w": jnp.arange(24.0).reshape(6, 4) / 24, "b": jnp.ones(6)}
        opt = eqxopt.Chain(
            eqxopt.ScaleByGaLore(rank=2, update_proj_gap=50),
            eqxopt.ScaleByLearningRate(1e-2),
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # the same updates as eqxopt.GaLore(1e-2, rank=2, update_proj_gap=50)
        ```
    """

    rank: int = eqx.field(default=128, static=True)
    update_proj_gap: ScalarLike = 200
    scale: ScalarLike = 1.0
    base_optimizer: AbstractOptimizer | None = None
    weight_dimension_numbers: Any = mask_field(default=None)
    state_dtype: DTypeLike | None = eqx.field(default=None, static=True, kw_only=True)


class GaLore(AbstractGaLore):
    r"""GaLore: memory-efficient training by gradient low-rank projection.

    The gradient $G_k$ of each matrix leaf ($m \times n$) is projected onto the
    $r' = \min(r, m, n)$-dimensional subspace of its top singular vectors,

    $$R_k = P_k^\top G_k \ (m \ge n), \qquad R_k = G_k P_k \ (m < n),$$

    with $P_k$ the top-$r'$ left (or right) singular vectors of $G_k$, recomputed
    every `update_proj_gap` steps ($T$; at $k \bmod T = 0$, the first step
    included) and kept in between. The base optimizer (default Adam's
    [`eqxopt.ScaleByAdam`][], so its moments are $r' \times n$ or $m \times r'$) runs
    on $R_k$, giving $N_k$, and the update is

    $$u_k = -\eta_k\,\bigl(s\,P_k N_k + \lambda\,p_k\bigr)
      \quad\text{(or } s\,N_k P_k^\top\text{)},$$

    $s$ = `scale`, the decoupled weight decay $\lambda$ on the leaves `mask` selects.
    Leaves that are not projected (by default all but the 2-D ones) get the base
    optimizer's update on their full gradient, unscaled (as Optax). Matches
    `optax.contrib.galore`; `weight_dimension_numbers` says which leaves are
    matrices and how (see [`eqxopt.GaLoreDimensionNumbers`][]).

    ??? cite "References"

        ```bibtex
        @inproceedings{zhao2024galore,
            title={GaLore: Memory-Efficient {LLM} Training by Gradient Low-Rank
                Projection},
            author={Zhao, Jiawei and Zhang, Zhenyu and Chen, Beidi and Wang, Zhangyang
                and Anandkumar, Anima and Tian, Yuandong},
            booktitle={ICML}, year={2024}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((6, 4)), "b": jnp.zeros(6)}
        grads = {"w": jnp.arange(24.0).reshape(6, 4) / 24, "b": jnp.ones(6)}
        opt = eqxopt.GaLore(1e-2, rank=2, update_proj_gap=50, weight_decay=1e-4)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert state.base_optimizer_state.nu["w"].shape == (2, 4)  # low-rank Adam
        ```
    """

    learning_rate: ScalarOrSchedule
    rank: int = eqx.field(default=128, static=True)
    update_proj_gap: ScalarLike = 200
    scale: ScalarLike = 1.0
    base_optimizer: AbstractOptimizer | None = None
    weight_decay: ScalarOrSchedule = 0.0
    mask: FilterSpec | None = mask_field(default=None)
    weight_dimension_numbers: Any = mask_field(default=None)
    state_dtype: DTypeLike | None = eqx.field(default=None, static=True, kw_only=True)


_ARGS = r"""- `rank`: $r \ge 1$, the rank of the projection (capped at $\min(m, n)$ per
    leaf). (Static.)
- `update_proj_gap`: $T \ge 1$, the number of steps between SVD refreshes of the
    projections; an int or an integer array (changing an array does not recompile).
- `scale`: $s$, multiplies the projected leaves' updates.
- `base_optimizer`: the eqxopt optimizer run in the low-rank space; it gets no
    params, so it must not need them. Default `eqxopt.ScaleByAdam()`.
"""
_DIMS = r"""- `weight_dimension_numbers`: which leaves are projected, and as which
    matrix: `None` (default) projects the 2-D leaves as stored; one
    [`eqxopt.GaLoreDimensionNumbers`][] applies to every leaf of rank >= 2; else a
    filter spec (a PyTree prefix of the params, or a per-leaf callable) giving each
    leaf a `GaLoreDimensionNumbers`, `True` (the default numbers) or `False`/`None`
    (not projected).
- `state_dtype`: dtype of the projections and of the default base optimizer's
    moments; default the param's. (Static, keyword-only.)
"""
ScaleByGaLore.__init__.__doc__ = "**Arguments:**\n\n" + _ARGS + _DIMS
GaLore.__init__.__doc__ = (
    "**Arguments:**\n\n"
    "- `learning_rate`: $\\eta$; a number, an array, or a schedule.\n"
    + _ARGS
    + (
        "- `weight_decay`: $\\lambda$, decoupled, in the full parameter space; a "
        "number or a schedule; default 0.\n"
        "- `mask`: which leaves are decayed, as a filter spec; default all.\n"
    )
    + _DIMS
)
