"""Kron: PSGD with Kronecker-factored preconditioners (Li 2018/2024), as `kron` of the
`psgd-jax` package."""

import dataclasses
import functools as ft
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, ArrayLike, Inexact, Int32, Key, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._filter_spec import resolve_mask
from .._misc import (
    abs_sq,
    compute_dtype,
    draws_per_leaf,
    increment,
    is_none,
    is_param,
    mask_field,
    out_dtype,
    resolve,
    scalar,
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
from .._random import check_key, pack_key, unpack_key
from ..schedules import AbstractSchedule
from .spread import (
    check_spread,
    find_spread,
    mesh_of,
    replicate,
    spread_field,
    spread_map,
)


_MEMORY_SAVE_MODES = (None, "one_diag", "all_diag")
_PRECISIONS = (None, "bfloat16", "tensorfloat32", "float32", "default", "high")
_PRECISIONS += ("highest",)


class PrecondUpdateProbSchedule(AbstractSchedule):
    r"""The default `preconditioner_update_probability` of [`eqxopt.Kron`][]:
    `psgd_jax.kron.precond_update_prob_schedule`, an exponential anneal with a flat
    start:

    $$p(n) = \min\left(\max\left(p_{\max}\, e^{-d\,(n - n_0)},\ p_{\min}\right),
      p_{\max}\right),$$

    which keeps the probability at `max_prob` for about `flat_start` updates, then
    decays it to `min_prob` (0.03 by about 4000 updates with the defaults).

    psgd-jax evaluates it at $n$ = the number of updates *including* the current one;
    eqxopt schedules are called with the number already applied, $k = n - 1$, so
    `PrecondUpdateProbSchedule()(k)` is psgd-jax's value at $k + 1$: the $k$-th update
    uses exactly psgd-jax's probability.

    !!! Example

        ```python
        import eqxopt

        schedule = eqxopt.PrecondUpdateProbSchedule()
        assert schedule(0) == 1.0 and schedule(10_000) == 0.03
        opt = eqxopt.Kron(1e-3, preconditioner_update_probability=schedule)
        ```
    """

    max_prob: float = 1.0
    min_prob: float = 0.03
    decay: float = 0.001
    flat_start: float = 500

    def __check_init__(self):
        for name in ("max_prob", "min_prob"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(
                    f"`PrecondUpdateProbSchedule({name}=...)` must be a number in "
                    f"(0, 1], got {value!r}."
                )
        if not isinstance(self.decay, (int, float)) or not self.decay >= 0:
            raise ValueError(
                "`PrecondUpdateProbSchedule(decay=...)` must be a number >= 0, got "
                f"{self.decay!r}."
            )

    def __call__(self, count: ArrayLike) -> Array:
        n = jnp.asarray(count, jnp.float32) + 1
        f = lambda v: jnp.asarray(v, jnp.float32)
        value = f(self.max_prob) * jnp.exp(-f(self.decay) * (n - f(self.flat_start)))
        return jnp.minimum(jnp.maximum(value, f(self.min_prob)), f(self.max_prob))


PrecondUpdateProbSchedule.__init__.__doc__ = """**Arguments:**

- `max_prob`: the probability during the flat start; default `1.0`.
- `min_prob`: the floor of the anneal; default `0.03`.
- `decay`: the exponential decay rate per update; default `0.001`.
- `flat_start`: the number of updates before the decay starts; default `500`.
"""


@typechecked
class KronState(eqx.Module):
    """State of [`eqxopt.Kron`][]: the step count, the momentum (`mu`; `None`
    everywhere when `b1=0`; [`eqxopt.QuantizedArray`][]s with a quantized
    `state_dtype`), the Kronecker factors (`Qs`: per param leaf a list with
    one factor per axis, an upper-triangular matrix or a diagonal stored as a vector;
    one scalar for a 0-d leaf), the counter of updates since the last preconditioner
    update, and the PRNG key.

    The key is stored as its raw key data bit-cast to `int32` (`key_data`) with the
    name of its implementation (`impl`, static), so that the state serialises with
    `eqx.tree_serialise_leaves`; `state.key` gives the typed key back. It never
    changes: the draws of update $k$ come from `jax.random.fold_in(state.key, k)`,
    as psgd-jax's come from `fold_in(PRNGKey(5318008), k)`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(4)}
        state = eqxopt.Kron(1e-3).init(params)
        assert [q.shape for q in state.Qs["w"]] == [(4, 4), (3, 3)]
        assert [q.shape for q in state.Qs["b"]] == [(4,)]  # 1-D: a diagonal factor
        state.key  # a typed PRNG key
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Stored]
    Qs: PyTree[Inexact[Array, "..."]]
    update_counter: Int32[Array, ""]
    key_data: Int32[Array, "..."]
    impl: str = eqx.field(static=True)

    @property
    def key(self) -> Key[Array, ""]:
        """The PRNG key, as a typed key array (`jax.random.key`)."""
        return unpack_key(self.key_data, self.impl)


@dataclasses.dataclass(frozen=True)
class _Leaf:
    """Static facts about one param leaf: which axes get a triangular factor, and
    whether it is a stack of scanned layers (mapped over its first axis)."""

    triangular: tuple[bool, ...]
    scanned: bool


def _triangular(
    shape: tuple[int, ...], max_size: int, min_ndim: int, mode: str | None
) -> tuple[bool, ...]:
    """psgd-jax's `_init_Q_exprs` rule: an axis gets a diagonal factor if its size is
    1 or above `max_size_triangular`, if the leaf has fewer than `min_ndim_triangular`
    axes, or if `memory_save_mode` makes it diagonal ("one_diag": the largest axis,
    the last of equal ones; "all_diag": every axis)."""
    if mode == "all_diag":
        diag = [True] * len(shape)
    else:
        diag = [False] * len(shape)
        if mode == "one_diag" and shape:
            diag[int(np.argsort(shape, kind="stable")[::-1][0])] = True
    return tuple(
        not (d == 1 or d > max_size or len(shape) < min_ndim or dg)
        for d, dg in zip(shape, diag)
    )


def _init_factors(shape, leaf: _Leaf, scale: float, dtype) -> list[Array]:
    if not shape:
        return [jnp.full((), scale, dtype)]
    s = scale ** (1 / len(shape))
    return [
        s * jnp.eye(d, dtype=dtype) if tri else jnp.full((d,), s, dtype)
        for d, tri in zip(shape, leaf.triangular)
    ]


# --- the PSGD Kron algebra, per leaf (a scanned leaf maps these over axis 0) ----------


def _others(x: Array, axis: int) -> tuple[int, ...]:
    return tuple(a for a in range(x.ndim) if a != axis)


def _apply_factor(q: Array, x: Array, axis: int) -> Array:
    """Multiply `x` along `axis` by the factor `q`: $Q x$ on that axis (a diagonal
    factor scales it)."""
    if q.ndim < 2:
        shape = [1] * x.ndim
        if x.ndim:
            shape[axis] = -1
        return x * q.reshape(shape)
    y = jnp.tensordot(q, x, axes=((1,), (axis,)))
    return jnp.moveaxis(y, 0, axis)


def _precondition(qs: list[Array], g: Array) -> Array:
    r"""$P g$ with $P = Q^H Q$ (psgd-jax's `_precond_grad`): each axis is multiplied by
    its factor, then by the factor's conjugate transpose."""
    for axis, q in enumerate(qs):
        if q.ndim < 2:
            g = _apply_factor(jnp.conj(q) * q, g, axis)
        else:
            g = _apply_factor(jnp.conj(q).T, _apply_factor(q, g, axis), axis)
    return g


def _solve_right(x: Array, a: Array) -> Array:
    """`x @ inv(a)` for an upper-triangular `a`, on `x`'s last axis."""
    flat = x.reshape((-1, x.shape[-1]))
    out = lax.linalg.triangular_solve(a, flat, left_side=False, lower=False)
    return out.reshape(x.shape)


def _conj_b(qs: list[Array], v: Array) -> Array:
    r"""$\bar V$ multiplied on each axis by the inverse factor (psgd-jax's `_conjB`,
    step for step: the first axis is moved last, each factor's inverse is applied on
    the last axis, which is then swapped with the next one). A matrix goes through
    `_conj_b_matrix`, the same two solves without the transposes."""
    if v.ndim == 2:
        return _conj_b_matrix(qs, v)
    order = v.ndim
    perm = list(range(order))
    b = jnp.transpose(jnp.conj(v), perm[1:] + perm[:1])
    for i, q in enumerate(qs):
        b = b / q if q.ndim < 2 else _solve_right(b, q)
        if i < order - 1:
            b = jnp.swapaxes(b, i, order - 1)
    return b


def _conj_b_matrix(qs: list[Array], v: Array) -> Array:
    r"""`_conj_b` of a matrix: $Q_0^{-\top} \bar V Q_1^{-1}$, solved as its transpose
    $Q_1^{-\top} (\bar V^\top Q_0^{-1})$ (a diagonal factor divides).

    LAPACK's triangular solves read and write column-major arrays, and the transpose
    of a row-major array is a column-major one with the same bytes. Solved this way,
    every operand of both solves (the transposed $\bar V$, each upper-triangular
    factor given as its lower-triangular transpose) and the transposed result are
    such views: XLA copies none of them (a transposing copy is, on CPU, a kernel of
    its own per shape, slower to compile than the solves).
    """
    q0, q1 = qs
    b = jnp.conj(v).T
    if q0.ndim < 2:
        b = b / q0
    else:
        b = lax.linalg.triangular_solve(
            q0.T, b, left_side=False, lower=True, transpose_a=True
        )
    if q1.ndim < 2:
        b = b / q1[:, None]
    else:
        b = lax.linalg.triangular_solve(q1.T, b, left_side=True, lower=True)
    return b.T


def _norm_lower_bound(a: Array) -> Array:
    """psgd-jax's cheap lower bound of the spectral norm of the Hermitian `a` (within
    a factor about sqrt(2) of it)."""
    max_abs = jnp.max(jnp.abs(a))

    def calc(a):
        a = a / max_abs
        aa = jnp.real(a * jnp.conj(a))
        sum0, sum1 = jnp.sum(aa, axis=0), jnp.sum(aa, axis=1)
        i, j = jnp.argmax(sum0), jnp.argmax(sum1)

        def by_column():
            x = jnp.conj(lax.dynamic_index_in_dim(a, i, 1, keepdims=False)) @ a
            return max_abs * jnp.linalg.norm((x / jnp.linalg.norm(x)) @ jnp.conj(a).T)

        def by_row():
            x = a @ jnp.conj(lax.dynamic_index_in_dim(a, j, 0, keepdims=False))
            return max_abs * jnp.linalg.norm(jnp.conj(a).T @ (x / jnp.linalg.norm(x)))

        return lax.cond(sum0[i] > sum1[j], by_column, by_row)

    return lax.cond(max_abs > 0, calc, lambda a: max_abs, a)


def _tiny(x: Array) -> Array:
    return jnp.asarray(jnp.finfo(x.dtype).tiny, x.dtype)


def _update_factors(qs: list[Array], g: Array, v: Array, lr) -> list[Array]:
    r"""One PSGD step on every factor (psgd-jax's `_conjB` and `_update_precond`): with
    $A = Q g$ and $B = Q^{-H} v$ (here `conj_b` $= \bar B$), factor $i$ moves along
    $\nabla_i = \mathrm{triu}(A_{(i)} A_{(i)}^H - B_{(i)} B_{(i)}^H)$ normalized by
    (a lower bound of) the norm of $A_{(i)} A_{(i)}^H + B_{(i)} B_{(i)}^H$. An empty
    leaf leaves its factors as they are (it has no statistics)."""
    if g.size == 0:
        return qs
    conj_b = _conj_b(qs, v)
    a = g
    for axis, q in enumerate(qs):
        a = _apply_factor(q, a, axis)
    conj_a = jnp.conj(a)
    b_conj = jnp.conj(conj_b)
    out = []
    for i, q in enumerate(qs):
        if g.ndim == 0:
            term1, term2 = a * conj_a, b_conj * conj_b
        elif q.ndim < 2:
            term1 = jnp.sum(a * conj_a, axis=_others(a, i))
            term2 = jnp.sum(b_conj * conj_b, axis=_others(a, i))
        else:
            axes = _others(a, i)
            term1 = jnp.tensordot(a, conj_a, axes=(axes, axes))
            term2 = jnp.tensordot(b_conj, conj_b, axes=(axes, axes))
        step = (term1 - term2) * scalar(lr, term1.dtype)
        if q.ndim < 2:
            step = step * q / (jnp.max(jnp.abs(term1 + term2)) + _tiny(step))
            out.append(q - step)
        else:
            step = jnp.triu(step)
            step = step / (_norm_lower_bound(term1 + term2) + _tiny(step))
            out.append(q - step @ q)
    return out


def _balance(qs: list[Array]) -> list[Array]:
    """Rescale the factors to equal max-norms with the same product (psgd-jax's
    `_balance_Q`). The factors of an empty leaf stay as they are."""
    if any(q.size == 0 for q in qs):
        return qs
    norms = jnp.stack([jnp.max(jnp.abs(q)) for q in qs])
    gmean = jnp.prod(norms) ** (1 / len(qs))
    return [q * (gmean / n).astype(q.dtype) for q, n in zip(qs, norms)]


def _clip_rms(u: Array) -> Array:
    """`u / max(1, rms(u) / 1.1)`: the preconditioned gradient's RMS is about 1, and is
    capped at 1.1 (psgd-jax)."""
    rms = jnp.sqrt(jnp.mean(abs_sq(u)))
    return u / jnp.maximum(jnp.ones((), rms.dtype), rms / scalar(1.1, rms.dtype))


class Kron(AbstractOptimizer[KronState]):
    r"""Kron: PSGD (preconditioned SGD, Li 2018) with a Kronecker-factored
    preconditioner $P = Q^H Q$, $Q = Q_1 \otimes \dots \otimes Q_d$, fitted online so
    that $P$ whitens the gradient noise; the update is the preconditioned momentum.

    For a leaf with gradient $g_k$ (update $k$ from 0, $n = k + 1$):

    $$m_k = \beta_1 m_{k-1} + (1 - \beta_1) g_k, \qquad
      \hat m_k = m_k / (1 - \beta_1^{\,n})$$

    With probability `preconditioner_update_probability` (in fact deterministically
    every $\lceil 1/p \rceil$ updates, as psgd-jax 0.2.9 does, counted by
    `update_counter`), each factor $Q_i$ takes one step of PSGD's preconditioner
    fit: with $v \sim \mathcal N(0, I)$, $h = \hat m_k + \sqrt{\epsilon_{32}}
    \,\overline{|\hat m_k|}\, v$ (or $g_k$ for $\hat m_k$ when
    `momentum_into_precond_update=False`), $A = Q h$ and $B = Q^{-H} v$ (by
    triangular solves),

    $$Q_i \leftarrow Q_i - \frac{\eta_P}{\|A_{(i)}A_{(i)}^H + B_{(i)}B_{(i)}^H\|}
      \,\mathrm{triu}\left(A_{(i)}A_{(i)}^H - B_{(i)}B_{(i)}^H\right) Q_i$$

    ($A_{(i)}$ is $A$ unfolded along axis $i$; a diagonal factor uses the diagonal
    and the max-norm, elementwise). With probability 0.01 per preconditioner update
    the factors are first rebalanced to equal max-norms. Then

    $$u_k = -\eta_k \left(\mathrm{clip}(Q^H Q\, \hat m_k) + \lambda W_k\right),
      \qquad \mathrm{clip}(x) = x / \max(1, \mathrm{rms}(x) / 1.1)$$

    (weight decay only on the leaves `weight_decay_mask` selects, added after the
    preconditioner, as psgd-jax chains `add_decayed_weights` before the learning rate).

    **Routing.** Every leaf is preconditioned; each axis gets an upper-triangular
    factor, or a diagonal one (a vector) if its size is 1 or larger than
    `max_size_triangular`, if the leaf has fewer than `min_ndim_triangular` axes
    (so 1-D leaves get a diagonal factor by default), or by `memory_save_mode`; a 0-d
    leaf gets one scalar. Factors start at `preconditioner_init_scale ** (1/ndim)`
    times the identity (and stay there for a leaf with no elements). In Equinox's
    `(out, in)` layout, a weight's first factor is `(out, out)` and its second
    `(in, in)` (psgd-jax's are per axis too, so layouts do not matter).

    **Randomness** comes from the typed PRNG key in the state, seeded by `key`:
    update $k$ draws from `jax.random.fold_in(key, k)` exactly as psgd-jax draws from
    `fold_in(PRNGKey(5318008), k)` (split once for the preconditioner update, then once
    for the balancing coin and once for the probe vectors, one per leaf), so
    `key=5318008` reproduces psgd-jax's draws. The preconditioner update is a
    `lax.cond`: steps that skip it do not compute it.

    **Sharding.** With `jit` and sharded params, the momentum is sharded like the
    params and the factors are replicated (see [`eqxopt.state_shardings`][]); the
    factor updates of same-shape leaves are spread over the mesh's devices, each
    computing its share (`spread`).

    **Defaults' provenance**: psgd-jax 0.2.9's `kron` (`learning_rate=0.001`,
    `b1=0.9`, `preconditioner_lr=0.1`, `max_size_triangular=8192`,
    `min_ndim_triangular=2`, the anneal of [`eqxopt.PrecondUpdateProbSchedule`][],
    ...). `key=0` is eqxopt's default seed.

    **Differences from the reference:**

    - Arithmetic runs in float32 or wider (float64 for float64 params), and the
      factors are stored in `precond_dtype`, by default the param's dtype (no
      state leaf is wider than the params). psgd-jax's default is
      JAX's default float: float32 (float64 under x64, even for float32 params). For
      float16/bfloat16 params pass `precond_dtype=jnp.float32` to keep psgd-jax's
      float32 factors. The probe vectors $v$ are drawn in the compute dtype
      (psgd-jax: in the gradient's dtype; the same numbers for float32 and float64
      gradients), the balancing coin in float32.
    - The momentum is stored in the param's dtype (or `state_dtype`, psgd-jax's
      `mu_dtype`, which may also quantize it: [`eqxopt.Quantized`][]); updates come
      back in the param's dtype.
    - The schedule for `preconditioner_update_probability` is called with the number
      of updates already applied, as every eqxopt schedule; psgd-jax calls it with
      that number plus one. The default schedule compensates (see
      [`eqxopt.PrecondUpdateProbSchedule`][]), so the default behaves identically;
      a custom psgd-jax schedule `f` is `lambda k: f(k + 1)` here.
    - `weight_decay_mask` is a filter spec (a PyTree prefix of bools, or a per-leaf
      callable), as every mask in eqxopt; psgd-jax's `weight_decay_mask` is an Optax
      mask (a tree, or a callable of the whole params tree).
    - psgd-jax prints the preconditioner sizes at `init`; this does not.
    - Flax `Partitioned` boxes are not unboxed (Equinox has none).

    **State memory** per `(m, n)` leaf with both axes triangular: $mn$ elements in the
    param's dtype (or `state_dtype`) for the momentum, plus $m^2 + n^2$ in the
    param's dtype (or `precond_dtype`) for the factors ($m$ or $n$ for a diagonal
    axis; a 1-D leaf of size $n$ has a diagonal factor, $n$, by default, and a 0-D
    leaf one scalar); plus, once, two `int32` counters and the key's data (two
    `int32` for the default threefry key).

    ??? cite "References"

        ```bibtex
        @article{li2018psgd,
            title={Preconditioned Stochastic Gradient Descent},
            author={Li, Xi-Lin}, journal={IEEE Transactions on Neural Networks and
            Learning Systems}, volume={29}, number={5}, pages={1454--1466},
            year={2018}}

        @article{li2024stochastic,
            title={Stochastic Hessian Fittings with Lie Groups},
            author={Li, Xi-Lin}, journal={arXiv:2402.11858}, year={2024}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(4)}
        grads = {"w": jnp.arange(12.0).reshape(4, 3), "b": jnp.ones(4)}
        opt = eqxopt.Kron(1e-3, weight_decay=1e-4, key=42)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule = 0.001
    b1: ScalarLike = 0.9
    weight_decay: ScalarOrSchedule = 0.0
    weight_decay_mask: FilterSpec | None = mask_field(default=None)
    preconditioner_update_probability: ScalarOrSchedule = PrecondUpdateProbSchedule()
    max_size_triangular: int = eqx.field(default=8192, static=True)
    min_ndim_triangular: int = eqx.field(default=2, static=True)
    memory_save_mode: str | None = eqx.field(default=None, static=True)
    momentum_into_precond_update: bool = eqx.field(default=True, static=True)
    preconditioner_lr: ScalarLike = 0.1
    preconditioner_init_scale: float = eqx.field(default=1.0, static=True)
    state_dtype: Any = eqx.field(default=None, static=True)
    precond_dtype: Any = eqx.field(default=None, static=True)
    precond_update_precision: str | None = eqx.field(
        default="tensorfloat32", static=True
    )
    precond_grads_precision: str | None = eqx.field(default=None, static=True)
    scanned_layers: FilterSpec | None = mask_field(default=None)
    lax_map_scanned_layers: bool = eqx.field(default=False, static=True)
    lax_map_batch_size: int = eqx.field(default=8, static=True)
    key: Any = 0
    spread: bool | str | tuple[str, ...] = spread_field()

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "weight_decay"),
            unit_interval=("b1",),
            positive=("preconditioner_lr", "preconditioner_update_probability"),
            closed_unit_interval=("preconditioner_update_probability",),
            positive_int=("max_size_triangular", "lax_map_batch_size"),
            choices={
                "memory_save_mode": _MEMORY_SAVE_MODES,
                "precond_update_precision": _PRECISIONS,
                "precond_grads_precision": _PRECISIONS,
            },
        )
        m = self.min_ndim_triangular
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0:
            raise ValueError(
                f"`Kron(min_ndim_triangular=...)` must be an integer >= 0, got {m!r}."
            )
        s = self.preconditioner_init_scale
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not s > 0:
            raise ValueError(
                "`Kron(preconditioner_init_scale=...)` must be a number > 0, got "
                f"{s!r}."
            )
        for name in ("state_dtype", "precond_dtype"):
            dtype = getattr(self, name)
            if name == "state_dtype" and plain_dtype(dtype) is None:
                continue  # quantized or per-buffer: checked against the buffers
            try:
                ok = dtype is None or jnp.issubdtype(dtype, jnp.inexact)
            except TypeError:
                ok = False
            if not ok:
                raise ValueError(
                    f"`Kron({name}=...)` must be a floating dtype or None, got "
                    f"{dtype!r}."
                )
        check_key(self)
        check_spread(self)

    # -- per-leaf facts ----------------------------------------------------------------

    def _leaves(self, params) -> tuple[list, Any, list]:
        """`(leaves, treedef, facts)`: one `_Leaf` per param leaf, `None` elsewhere."""
        leaves, treedef = jtu.tree_flatten(params, is_leaf=is_none)
        if self.scanned_layers is None:
            scanned = [False] * len(leaves)
        else:
            mask = resolve_mask(
                self.scanned_layers, params, what="`Kron(scanned_layers=...)`"
            )
            scanned = [m is True for m in treedef.flatten_up_to(mask)]
        facts = []
        for p, s in zip(leaves, scanned):
            if not is_param(p):
                facts.append(None)
                continue
            if s and p.ndim == 0:
                raise ValueError(
                    "`Kron(scanned_layers=...)` selects a 0-d leaf; scanned layers "
                    "are stacked along their first axis."
                )
            shape = tuple(p.shape[1:] if s else p.shape)
            if len(shape) > 13:
                raise ValueError(
                    f"`Kron` supports leaves of rank <= 13 (as psgd-jax), got shape "
                    f"{p.shape}."
                )
            tri = _triangular(
                shape,
                self.max_size_triangular,
                self.min_ndim_triangular,
                self.memory_save_mode,
            )
            facts.append(_Leaf(tri, s))
        return leaves, treedef, facts

    def _precond_dtype(self, p) -> np.dtype:
        if self.precond_dtype is not None:
            return np.dtype(self.precond_dtype)
        return np.dtype(p.dtype)

    def _has_mu(self) -> bool:
        return not (isinstance(self.b1, (int, float)) and self.b1 == 0)

    def _param_buffers(self) -> dict[str, bool]:
        return {"mu": False} if self._has_mu() else {}

    # -- protocol --------------------------------------------------------------------

    def init(self, params: Params) -> KronState:
        leaves, treedef, facts = self._leaves(params)
        storage = storage_of(self.state_dtype, "mu")
        mu = [
            new_buffer(p, 0, storage, False)
            if f is not None and self._has_mu()
            else None
            for p, f in zip(leaves, facts)
        ]
        qs = []
        for p, f in zip(leaves, facts):
            if f is None:
                qs.append(None)
                continue
            shape = tuple(p.shape[1:] if f.scanned else p.shape)
            factors = _init_factors(
                shape, f, float(self.preconditioner_init_scale), self._precond_dtype(p)
            )
            if f.scanned:
                factors = [
                    jnp.broadcast_to(q, (p.shape[0],) + q.shape) for q in factors
                ]
            qs.append(factors)
        key = self.key
        if isinstance(key, (int, np.integer)):
            key = jr.key(int(key))
        elif not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jr.wrap_key_data(jnp.asarray(key, jnp.uint32))
        data, impl = pack_key(key)
        return KronState(
            count=zero_count(),
            mu=jtu.tree_unflatten(treedef, mu),
            Qs=jtu.tree_unflatten(treedef, qs),
            update_counter=zero_count(),
            key_data=data,
            impl=impl,
        )

    def _map(self, scanned: bool, fn: Callable, *args):
        """`fn(*args)`, mapped over the first axis of a scanned leaf."""
        if not scanned:
            return fn(*args)
        if self.lax_map_scanned_layers:
            size = self.lax_map_batch_size
            return lax.map(
                lambda xs: fn(*xs), args, batch_size=size if size > 1 else None
            )
        return jax.vmap(fn)(*args)

    def update(self, grads: Updates, state: KronState, params=None, **extra):
        count = increment(state.count)
        lr = resolve(self.learning_rate, state.count)
        wd = resolve(self.weight_decay, state.count)
        prob = resolve(self.preconditioner_update_probability, state.count)
        decay = not (isinstance(wd, (int, float)) and wd == 0)
        if decay:
            need_params(self, params, "for the weight decay")
        # Route: the preconditioned leaves, with their grads, buffers and factors.
        work = self._gather(grads, state, params)
        mu, mom, raw = self._momentum(work, count)
        # Update the factors, every leaf at once, when the schedule says so.
        counter = increment(state.update_counter)
        do_update = counter.astype(jnp.float32) >= 1 / jnp.asarray(prob, jnp.float32)
        counter = jnp.where(do_update, jnp.zeros_like(counter), counter)
        _, subkey = jr.split(jr.fold_in(state.key, state.count))
        precond_in = mom if self.momentum_into_precond_update else raw
        qs = lax.cond(
            do_update,
            ft.partial(self._refresh_factors, work, precond_in),
            lambda key, qs: qs,
            subkey,
            work.qs,
        )
        updates = self._finish(work, qs, mom, lr, wd, decay, params)
        new_state = KronState(
            count=count,
            mu=work.tree(mu),
            # Replicated over the params' mesh, as `state_shardings` predicts (XLA
            # would otherwise pick their shardings).
            Qs=replicate(work.tree(qs), mesh_of(work.grads)),
            update_counter=counter,
            key_data=state.key_data,
            impl=state.impl,
        )
        return work.tree(updates), new_state

    # -- the steps of `update` -------------------------------------------------------

    def _gather(self, grads, state: KronState, params) -> "_Work":
        """The preconditioned leaves of one update, each with its grad, momentum,
        factors, param and compute dtype; checks that grads, params and state agree."""
        leaves, treedef, facts = self._leaves(grads if params is None else params)
        g_leaves = treedef.flatten_up_to(grads)
        q_leaves = treedef.flatten_up_to(state.Qs)
        for g, f, q in zip(g_leaves, facts, q_leaves):
            if (f is None) != (not is_param(g)) or (f is None) != (q is None):
                raise ValueError(
                    "eqxopt: `Kron.update` got grads, params and state whose "
                    "optimised leaves differ; pass grads with the structure of the "
                    "params the state was initialised with."
                )
        idx = [i for i, f in enumerate(facts) if f is not None]
        for i in idx:
            qs = q_leaves[i]
            if facts[i].scanned:
                state_shape = (qs[0].shape[0],) + tuple(
                    q.shape[1] for q in qs if q.ndim > 1
                )
            else:
                state_shape = tuple(q.shape[0] for q in qs if q.ndim > 0)
            for what, x in (("param", leaves[i]), ("gradient", g_leaves[i])):
                if tuple(x.shape) != state_shape:
                    raise ValueError(
                        f"eqxopt: `Kron.update` got a {what} of shape {x.shape} "
                        f"where the state was initialised for shape {state_shape}."
                    )
        mu_leaves = treedef.flatten_up_to(state.mu)
        grads_ = [g_leaves[i] for i in idx]
        mus = [mu_leaves[i] for i in idx]
        qs_ = [list(q_leaves[i]) for i in idx]
        dtypes = [
            compute_dtype(g.dtype, q[0].dtype, *([] if m is None else [dtype_of(m)]))
            for g, m, q in zip(grads_, mus, qs_)
        ]
        return _Work(
            treedef=treedef,
            size=len(leaves),
            positions=idx,
            facts=[facts[i] for i in idx],
            grads=grads_,
            mu=mus,
            qs=qs_,
            params=[None if params is None else leaves[i] for i in idx],
            dtypes=dtypes,
            spread=find_spread(self.spread, grads_, "Kron"),
        )

    def _momentum(self, work: "_Work", count):
        """`(new mu, bias-corrected momentum, raw grads)` per preconditioned leaf, in
        the compute dtype (the momentum is the grad itself without a buffer)."""
        new_mu, mom, raw = [], [], []
        for g, m, dt in zip(work.grads, work.mu, work.dtypes):
            g32 = g.astype(dt)
            raw.append(g32)
            if m is None:
                new_mu.append(None)
                mom.append(g32)
                continue
            b1 = scalar(self.b1, dt)
            m32 = b1 * read(m, dt) + (1 - b1) * g32
            new_mu.append(write(m32, m))
            mom.append(m32 / (1 - b1 ** count.astype(dt)))
        return new_mu, mom, raw

    def _refresh_factors(self, work: "_Work", precond_in, key, qs):
        """psgd-jax's factor update of every leaf at once (spread over the mesh),
        balancing the factors' norms with probability 0.01."""
        scanned = [f.scanned for f in work.facts]
        with jax.default_matmul_precision(self.precond_update_precision):
            key, sub = jr.split(key)
            balance = jr.uniform(sub, dtype=jnp.float32) < 0.01
            _, sub = jr.split(key)
            keys = jr.split(sub, len(work.positions))
            specs = [(h.shape, dt) for h, dt in zip(precond_in, work.dtypes)]
            noise = draws_per_leaf(jr.normal, keys, specs)
            tasks = [
                ((dt, s), (*q, h, v))
                for v, h, q, dt, s in zip(noise, precond_in, qs, work.dtypes, scanned)
            ]

            # Everything per leaf happens in `fn`, which `spread_map` stacks by
            # shape: the balancing, the damping noise and the factor update compile
            # once per shape, not once per leaf (the same operations on each leaf).
            def fn(static, shared, *operands):
                dt, scanned = static
                lr_p, balance = shared
                *q, h, v = operands
                if len(q) > 1:
                    q = lax.cond(
                        balance,
                        lambda q: list(self._map(scanned, _balance, q)),
                        lambda q: q,
                        list(q),
                    )
                damp = jnp.sqrt(jnp.finfo(jnp.float32).eps)
                h = h + damp.astype(h.dtype) * jnp.mean(jnp.abs(h)) * v
                update = lambda q, h, v: _update_factors(
                    [x.astype(dt) for x in q], h, v, lr_p
                )
                out = self._map(scanned, update, q, h, v)
                return [x.astype(y.dtype) for x, y in zip(out, q)]

            shared = (self.preconditioner_lr, balance)
            return spread_map(fn, tasks, work.spread, shared=shared)

    def _finish(self, work: "_Work", qs, mom, lr, wd, decay: bool, params):
        """Precondition the momentum (every leaf at once, spread over the mesh; leaf
        by leaf on CPU without one, which compiles faster: `spread_map`'s `cheap`),
        clip its RMS, add weight decay on the leaves `weight_decay_mask` selects,
        scale by `-lr`; in the params' dtype."""
        mask = None
        if decay and self.weight_decay_mask is not None:
            what = "`Kron(weight_decay_mask=...)`"
            resolved = resolve_mask(self.weight_decay_mask, params, what=what)
            mask = work.treedef.flatten_up_to(resolved)

        def precondition(static, _, *operands):
            dt, scanned = static
            *q, g = operands
            fn = lambda q, g: _precondition([x.astype(dt) for x in q], g)
            return _clip_rms(self._map(scanned, fn, q, g))

        tasks = [
            ((dt, f.scanned), (*q, m))
            for dt, f, q, m in zip(work.dtypes, work.facts, qs, mom)
        ]
        with jax.default_matmul_precision(self.precond_grads_precision):
            preconditioned = spread_map(precondition, tasks, work.spread, cheap=True)
        updates = []
        for i, u, g, p, dt in zip(
            work.positions, preconditioned, work.grads, work.params, work.dtypes
        ):
            if decay and (mask is None or mask[i] is True):
                assert p is not None
                u = u + scalar(wd, dt) * p.astype(dt)
            updates.append((-scalar(lr, dt) * u).astype(out_dtype(g, p)))
        return updates


class _Work(NamedTuple):
    """The preconditioned leaves of one `Kron.update`, in leaf order: `positions` are
    their places among the flattened params (`size` leaves, `treedef`)."""

    treedef: Any
    size: int
    positions: list
    facts: list
    grads: list
    mu: list
    qs: list
    params: list
    dtypes: list
    spread: Any

    def tree(self, values: list):
        """A tree of the params' structure: `values` at the preconditioned leaves,
        `None` elsewhere."""
        out: list = [None] * self.size
        for i, v in zip(self.positions, values):
            out[i] = v
        return jtu.tree_unflatten(self.treedef, out)


Kron.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule; default `0.001`.
- `b1`: momentum decay $\beta_1$ in `[0, 1)`; default `0.9`. With `b1=0` (a Python
    number) there is no momentum buffer.
- `weight_decay`: $\lambda$, added to the preconditioned update before the learning
    rate; default `0.0`.
- `weight_decay_mask`: which leaves are decayed, as a filter spec (a PyTree prefix of
    bools, or a per-leaf callable); default all.
- `preconditioner_update_probability`: $p$ in `(0, 1]` or a schedule; the factors
    are updated every $\lceil 1/p \rceil$ updates. Default
    [`eqxopt.PrecondUpdateProbSchedule`][]`()` (1.0 for ~500 updates, then down to
    0.03).
- `max_size_triangular`: axes longer than this get a diagonal factor; default `8192`.
    (Static.)
- `min_ndim_triangular`: leaves with fewer axes get diagonal factors only; default
    `2`. (Static.)
- `memory_save_mode`: `None` (triangular factors where allowed, default),
    `"one_diag"` (the largest axis diagonal) or `"all_diag"`. (Static.)
- `momentum_into_precond_update`: fit the preconditioner to the momentum (default
    `True`) or to the raw gradient. (Static.)
- `preconditioner_lr`: $\eta_P$, the step size of the factors' fit; default `0.1`.
- `preconditioner_init_scale`: the initial preconditioner is this times the
    identity; default `1.0`. (Static.)
- `state_dtype`: dtype of the momentum (psgd-jax's `mu_dtype`); default the param's.
    An [`eqxopt.Quantized`][] (or a dict `{"mu": ...}`) quantizes it. (Static.)
- `precond_dtype`: dtype of the factors; default the param's (psgd-jax: float32;
    pass `jnp.float32` for low-precision params). (Static.)
- `precond_update_precision`, `precond_grads_precision`: matmul precision
    (`jax.default_matmul_precision`) of the preconditioner update and of the
    preconditioning; defaults `"tensorfloat32"` and `None` (psgd-jax's). (Static.)
- `scanned_layers`: a filter spec of bools marking leaves that stack layers along
    their first axis; each layer gets its own factors (mapped with `vmap`). (Static.)
- `lax_map_scanned_layers`, `lax_map_batch_size`: map scanned layers with
    `lax.map` in batches of this size instead of `vmap`, to save memory; defaults
    `False`, `8`. (Static.)
- `key`: the PRNG seed (an int) or a `jax.random.key`; default `0`.
- `spread`: under `jit` with params on a mesh, how the devices share the per-matrix
    work (the factor updates, with their triangular solves): `True` (default) stacks
    same-shape matrices and splits the stacks over every mesh axis (each device
    computes its share, the results are all-gathered); a mesh axis name or a tuple
    of names uses those axes; `False` repeats the work on every device. (Static.)
"""
