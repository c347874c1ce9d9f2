r"""The matrix toolbox shared by the matrix-preconditioned optimizers (SOAP, Shampoo,
Kron, Muon, NorMuon): which axes of a leaf are preconditioned, eigenbases, inverse p-th
roots, a refresh-every-k switch and Newton-Schulz orthogonalisation. Spreading this
work over the devices of a mesh is `spread.py`'s.

Every function here is pure and jit/vmap-safe; none creates host-side state. The
function names are stable (other optimizer modules import them):

- [`MatrixView`][], [`matrix_view`][], [`merge_dims`][], [`BlockPartition`][]: how a
  param leaf is seen as a tensor whose axes are preconditioned (or not);
- [`project`][], [`project_back`][]: rotate a tensor axis by axis into (out of) a list
  of bases, `None` meaning "leave this axis alone";
- [`gram`][]: the statistic $G_{(k)} G_{(k)}^\top$ of one axis;
- [`eigh_basis`][]: eigenvectors by `eigh`, descending (SOAP's `get_orthogonal_matrix`);
- [`qr_power_basis`][]: one power iteration and a QR (SOAP's
  `get_orthogonal_matrix_QR`);
- [`power_iteration`][], [`matrix_inverse_pth_root`][]: distributed Shampoo's coupled
  Newton iteration for $(A + \epsilon I)^{-1/p}$;
- [`eigh_inverse_pth_root`][]: the same root through `eigh`;
- [`cond`][]: `lax.cond` with matrices crossing the branches flat (one layout);
- [`every_k`][]: `lax.cond(count % k == 0, refresh, keep, ...)`;
- [`newton_schulz`][]: Muon's quintic Newton-Schulz orthogonalization;
"""

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, ArrayLike

from eqxopt._matrix.spread import explicit_sharding, mesh_of

from .._checks import concrete_scalar
from .._misc import compute_dtype


def check_dimension_numbers(numbers) -> None:
    """Validate and normalise the `reduction_axis` / `output_axis` fields of a frozen
    dimension-numbers dataclass (Muon's, GaLore's): each is an int or a non-empty
    sequence of ints, stored as an int or a tuple."""
    for name in ("reduction_axis", "output_axis"):
        value = getattr(numbers, name)
        axes = (value,) if isinstance(value, int) else tuple(value)
        if not axes or not all(
            isinstance(a, int) and not isinstance(a, bool) for a in axes
        ):
            raise ValueError(
                f"`{type(numbers).__name__}({name}=...)` must be an int or a non-empty "
                f"sequence of ints, got {value!r}."
            )
        object.__setattr__(numbers, name, value if isinstance(value, int) else axes)


HIGHEST = jax.lax.Precision.HIGHEST


# --- which axes are preconditioned --------------------------------------------------


def merge_dims(shape: Sequence[int], max_dim: int) -> tuple[int, ...]:
    """Merge neighbouring axes while their product stays `<= max_dim`.

    `(1, 2, 512, 1, 2048, 1, 3, 4) -> (1024, 2048, 12)` for `max_dim=1024`. This is
    distributed Shampoo's `merge_small_dims` and, for rank >= 1, SOAP's `merge_dims`
    (the two agree there); all-ones shapes give `(1,)`, a scalar `()`, a shape with no
    elements `(0,)`.
    """
    shape = tuple(int(d) for d in shape)
    if shape and all(d == 1 for d in shape):
        return (1,)
    if 0 in shape:
        return (0,)
    out: list[int] = []
    product = 1
    for d in shape:
        if product * d <= max_dim:
            product *= d
        else:
            if product > 1:
                out.append(product)
            product = d
    if product > 1:
        out.append(product)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class MatrixView:
    """How one param leaf is seen by a matrix preconditioner.

    The leaf (shape `shape`) is transposed by `perm`, then reshaped to `view_shape`;
    axis `i` of the view gets a preconditioner iff `preconditioned[i]`. Muon's
    `(batch, out, in)` stacks are the view `preconditioned=(False, True, True)` (see
    [`matrix_view`][]'s `dimension_numbers`); SOAP's and Shampoo's are the (merged)
    axes whose size is at most their limit.

    Static (hashable, no arrays): build it at trace time from the leaf's shape.
    """

    shape: tuple[int, ...]
    view_shape: tuple[int, ...]
    preconditioned: tuple[bool, ...]
    perm: tuple[int, ...] | None = None

    @property
    def any(self) -> bool:
        """Whether any axis is preconditioned."""
        return any(self.preconditioned)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The sizes of the preconditioned axes, in order (one factor matrix each)."""
        return tuple(d for d, p in zip(self.view_shape, self.preconditioned) if p)

    def to_view(self, x: Array) -> Array:
        """`x` (of `shape`) as the view."""
        if self.perm is not None:
            x = jnp.transpose(x, self.perm)
        return x.reshape(self.view_shape)

    def from_view(self, x: Array) -> Array:
        """The inverse of [`MatrixView.to_view`][]."""
        if self.perm is None:
            return x.reshape(self.shape)
        x = x.reshape(tuple(self.shape[a] for a in self.perm))
        return jnp.transpose(x, tuple(int(a) for a in np.argsort(self.perm)))


def matrix_view(
    shape: Sequence[int],
    *,
    max_dim: int | None = None,
    merge: int | None = None,
    precondition_1d: bool = True,
    min_rank: int = 1,
    dimension_numbers: tuple[int | tuple[int, ...], int | tuple[int, ...]]
    | None = None,
) -> MatrixView:
    """Decide which axes of a leaf of `shape` are preconditioned.

    **Arguments:**

    - `max_dim`: axes longer than this are not preconditioned (SOAP's
        `max_precond_dim`); `None` for no limit.
    - `merge`: if given, neighbouring axes are first merged by [`merge_dims`][] with
        this limit (SOAP's `merge_dims=True` uses `max_precond_dim`; Shampoo's
        `best_effort_shape_interpretation` uses `merge_small_dims_block_size`).
    - `precondition_1d`: whether a rank-1 leaf is preconditioned (SOAP's
        `precondition_1d`).
    - `min_rank`: leaves of lower rank are not preconditioned at all.
    - `dimension_numbers`: `(reduction_axis, output_axis)` as in
        `eqxopt.MuonDimensionNumbers`: the view is Muon's `(batch, out, in)` stack,
        with the batch axis not preconditioned.

    Without `dimension_numbers`, a leaf with no elements has no preconditioned axis
    (its statistics are empty: there is nothing to learn a preconditioner from).
    """
    shape = tuple(int(d) for d in shape)
    if dimension_numbers is not None:
        ndim = len(shape)
        red, out = ((a,) if isinstance(a, int) else tuple(a) for a in dimension_numbers)
        red = tuple(a % ndim for a in red)
        out = tuple(a % ndim for a in out)
        batch = tuple(a for a in range(ndim) if a not in red and a not in out)
        perm = batch + out + red
        size = lambda axes: math.prod(shape[a] for a in axes)
        return MatrixView(
            shape,
            (size(batch), size(out), size(red)),
            (False, True, True),
            None if perm == tuple(range(ndim)) else perm,
        )
    view = shape
    if merge is not None and len(shape) > 1:
        view = merge_dims(shape, merge)
    if (
        len(shape) < min_rank
        or (len(shape) == 1 and not precondition_1d)
        or math.prod(shape) == 0
    ):
        flags = (False,) * len(view)
    else:
        flags = tuple(max_dim is None or d <= max_dim for d in view)
    return MatrixView(shape, view, flags)


@dataclasses.dataclass(frozen=True)
class BlockPartition:
    """Split every axis longer than `block_size` into blocks of `block_size` (the last
    one shorter), as distributed Shampoo's `BlockPartitioner`; blocks are listed with
    the last axis varying fastest."""

    shape: tuple[int, ...]
    block_size: int

    @property
    def splits(self) -> tuple[tuple[int, ...], ...]:
        """Per axis, the sizes of its blocks."""
        out = []
        for d in self.shape:
            if 0 < self.block_size < d:
                n, r = divmod(d, self.block_size)
                out.append((self.block_size,) * n + ((r,) if r else ()))
            else:
                out.append((d,))
        return tuple(out)

    @property
    def block_shapes(self) -> list[tuple[int, ...]]:
        import itertools

        return list(itertools.product(*self.splits))

    def partition(self, x: Array) -> list[Array]:
        blocks = [x]
        for axis, sizes in enumerate(self.splits):
            if len(sizes) == 1:
                continue
            cuts = list(np.cumsum(sizes)[:-1])
            blocks = [b for t in blocks for b in jnp.split(t, cuts, axis=axis)]
        return blocks

    def merge(self, blocks: Sequence[Array]) -> Array:
        blocks = list(blocks)
        for axis in reversed(range(len(self.shape))):
            n = len(self.splits[axis])
            if n == 1:
                continue
            blocks = [
                jnp.concatenate(blocks[i : i + n], axis=axis)
                for i in range(0, len(blocks), n)
            ]
        (out,) = blocks
        return out


# --- rotations and statistics --------------------------------------------------------


def project(x: Array, bases: Sequence[Array | None]) -> Array:
    r"""Rotate each axis `k` of `x` into the basis `bases[k]`: $x \times_k Q_k^\top$
    (for a matrix, $Q_L^\top X Q_R$). A `None` basis leaves its axis alone. SOAP's
    `project`."""
    for k, q in enumerate(bases):
        if q is not None:
            x = jnp.moveaxis(
                jnp.tensordot(
                    x, q.astype(x.dtype), axes=((k,), (0,)), precision=HIGHEST
                ),
                -1,
                k,
            )
    return x


def project_back(x: Array, bases: Sequence[Array | None]) -> Array:
    r"""The inverse rotation of [`project`][] for orthogonal bases: $x \times_k Q_k$
    (for a matrix, $Q_L X Q_R^\top$). SOAP's `project_back`."""
    for k, q in enumerate(bases):
        if q is not None:
            x = jnp.moveaxis(
                jnp.tensordot(
                    x, q.astype(x.dtype), axes=((k,), (1,)), precision=HIGHEST
                ),
                -1,
                k,
            )
    return x


def gram(x: Array, axis: int) -> Array:
    r"""$X_{(k)} X_{(k)}^\top$: `x` contracted with itself over every axis but `axis`
    (`(n, n)` for `n = x.shape[axis]`). Replicated over the mesh when `x` is sharded
    over `Explicit` mesh axes (as the factor matrices `init` builds are)."""
    axes = tuple(a for a in range(x.ndim) if a != axis)
    sharding = explicit_sharding(x)
    if sharding is not None:
        return jax.lax.dot_general(
            x,
            x,
            ((axes, axes), ((), ())),
            precision=HIGHEST,
            out_sharding=jax.sharding.NamedSharding(
                sharding.mesh, jax.sharding.PartitionSpec()
            ),
        )
    return jnp.tensordot(x, x, axes=(axes, axes), precision=HIGHEST)


# --- eigenbases -----------------------------------------------------------------------


def eigh_basis(matrix: Array) -> Array:
    r"""The eigenvectors of the symmetric `matrix`, as columns ordered by descending
    eigenvalue: SOAP's `get_orthogonal_matrix` (`eigh(M + 1e-30 I)`, flipped). Computed
    in at least float32, returned in `matrix`'s dtype."""
    dtype = compute_dtype(matrix.dtype)
    m = matrix.astype(dtype)
    m = m + jnp.asarray(1e-30, dtype) * jnp.eye(m.shape[0], dtype=dtype)
    # `eigh`'s own symmetrization, done here: its result equals its conjugate
    # transpose bit for bit, and the transpose of a row-major array is the
    # column-major one LAPACK reads, without a transposing copy.
    s = (m + jnp.conj(m).T) / 2
    _, q = jnp.linalg.eigh(jnp.conj(s).T, symmetrize_input=False)
    return jnp.flip(q, axis=1).astype(matrix.dtype)


def qr_power_basis(matrix: Array, basis: Array) -> tuple[Array, Array]:
    r"""Refresh an eigenbasis by one power iteration and a QR: SOAP's
    `get_orthogonal_matrix_QR`.

    With $\lambda = \operatorname{diag}(Q^\top M Q)$ and `order` the permutation that
    sorts $\lambda$ descending, the new basis is
    $\operatorname{qr}(M\,Q_{:,\rm order})$ ($\lambda$ from $M Q$, so one matrix
    product serves both; estimates that tie to rounding, as a rank-deficient $M$'s
    zero eigenvalues, may sort otherwise than the reference's $(Q^\top M) Q$).
    Returns `(new_basis, order)`; the caller permutes whatever is indexed by the old
    basis' columns (SOAP's second moment) by `order`.
    """
    dtype = compute_dtype(matrix.dtype)
    m, q = matrix.astype(dtype), basis.astype(dtype)
    # diag(Q^T M Q) as the column sums of Q * (M Q): no transposed operand (XLA:CPU
    # would copy it, a kernel per shape), and M Q serves the power step too.
    mq = jnp.matmul(m, q, precision=HIGHEST)
    est = jnp.sum(q * mq, axis=0)
    order = jnp.argsort(-est, stable=True)
    new, _ = jnp.linalg.qr(mq[:, order])
    return new.astype(basis.dtype), order


# --- inverse p-th roots -------------------------------------------------------------


def power_iteration(
    matrix: Array,
    num_iters: int = 100,
    error_tolerance: float = 1e-6,
) -> tuple[Array, Array]:
    """The top eigenpair `(v, lambda)` of a symmetric PSD `matrix` by power iteration,
    as distributed Shampoo's (the same fixed start vector, from
    `np.random.RandomState(1729)`, so no PRNG state; stops when the Rayleigh quotient
    moves by at most `error_tolerance`)."""
    n = matrix.shape[-1]
    v0 = jnp.asarray(
        np.random.RandomState(1729).uniform(-1.0, 1.0, n).astype(matrix.dtype)
    )

    def cond(state):
        i, _, _, run = state
        return (i < num_iters) & run

    def body(state):
        i, v, s, _ = state
        v = v / jnp.linalg.norm(v)
        sv = jnp.matmul(matrix, v, precision=HIGHEST)
        s_new = jnp.vdot(v, sv, precision=HIGHEST)
        return i + 1, sv, s_new, jnp.abs(s_new - s) > error_tolerance

    init = (jnp.zeros((), jnp.int32), v0, jnp.zeros((), matrix.dtype), jnp.array(True))
    _, v, s, _ = jax.lax.while_loop(cond, body, init)
    return v / jnp.linalg.norm(v), s


def _mat_power(m: Array, p: int) -> Array:
    """`m**p` by repeated squaring (the order of distributed Shampoo's `mat_power`)."""
    result = jnp.eye(m.shape[0], dtype=m.dtype)
    while p > 0:
        if p % 2 == 1:
            result = jnp.matmul(m, result, precision=HIGHEST)
        p //= 2
        if p > 0:
            m = jnp.matmul(m, m, precision=HIGHEST)
    return result


def matrix_inverse_pth_root(
    matrix: Array,
    p: int,
    num_iters: int = 100,
    ridge_epsilon: ArrayLike = 1e-6,
    error_tolerance: float = 1e-6,
    relative_matrix_epsilon: bool = True,
) -> tuple[Array, Array]:
    r"""$(A + \epsilon I)^{-1/p}$ for a symmetric PSD $A$ by the coupled Newton
    iteration (Higham, *Functions of Matrices*, eq. 7.18), as distributed Shampoo's
    `matrix_inverse_pth_root` (without its LOBPCG deflation and padding).

    $\epsilon$ is `ridge_epsilon`, times $\max(\lambda_{\max}(A), 10^{-6})$ (by
    [`power_iteration`][]) when `relative_matrix_epsilon`. With $z = (1+p) /
    (2\|A + \epsilon I\|_F)$, $M_0 = z(A + \epsilon I)$, $H_0 = z^{1/p} I$:

    $$T_i = (1 + 1/p)\,I - M_i/p,\qquad M_{i+1} = T_i^p M_i,\qquad H_{i+1} = H_i T_i$$

    until $\max|M_i - I| \le$ `error_tolerance`, `num_iters`, or the error grows by a
    factor 1.2 (then the previous $H$ is returned). Runs in `matrix`'s dtype (pass
    float64 for the reference's precision). `p` is a static Python int.

    Returns `(root, error)`, `error` being $\max|M - I|$ at the end (float32); callers
    keep their previous root when it is NaN or too large (Shampoo's
    `inverse_failure_threshold`).
    """
    n = matrix.shape[0]
    dtype = matrix.dtype
    alpha = jnp.asarray(-1.0 / p, dtype)
    identity = jnp.eye(n, dtype=dtype)
    if relative_matrix_epsilon:
        _, max_ev = power_iteration(matrix)
    else:
        max_ev = jnp.ones((), dtype)
    ridge = jnp.asarray(ridge_epsilon, dtype) * jnp.maximum(
        max_ev, jnp.asarray(1e-6, dtype)
    )
    if n == 1:
        return (matrix + ridge) ** alpha, jnp.zeros((), jnp.float32)
    max_error_ratio = 1.2

    def cond(state):
        i, _, _, _, error, ratio = state
        return (i < num_iters) & (error > error_tolerance) & (ratio < max_error_ratio)

    def body(state):
        i, mat_m, mat_h, _, error, _ = state
        mat_m_i = (1 - alpha) * identity + alpha * mat_m
        new_m = jnp.matmul(_mat_power(mat_m_i, p), mat_m, precision=HIGHEST)
        new_h = jnp.matmul(mat_h, mat_m_i, precision=HIGHEST)
        new_error = jnp.max(jnp.abs(new_m - identity))
        return i + 1, new_m, new_h, mat_h, new_error, new_error / error

    damped = matrix + ridge * identity
    z = (1 + p) / (2 * jnp.linalg.norm(damped))
    m0 = damped * z
    h0 = identity * z ** (1.0 / p)
    error0 = jnp.max(jnp.abs(m0 - identity))
    init = (jnp.zeros((), jnp.int32), m0, h0, h0, error0, jnp.ones((), dtype))
    _, mat_m, mat_h, old_h, _, ratio = jax.lax.while_loop(cond, body, init)
    error = jnp.max(jnp.abs(mat_m - identity)).astype(jnp.float32)
    root = jnp.where(ratio < max_error_ratio, mat_h, old_h)
    return root, error


def eigh_inverse_pth_root(
    matrix: Array,
    p: float,
    ridge_epsilon: ArrayLike = 1e-6,
    relative_matrix_epsilon: bool = True,
) -> Array:
    r"""$(A + \epsilon I)^{-1/p}$ through `eigh`: $U \operatorname{diag}((\lambda_i +
    \epsilon)^{-1/p}) U^\top$, eigenvalues clipped at 0, with $\epsilon$ as in
    [`matrix_inverse_pth_root`][] (relative to $\lambda_{\max}$). Slower on
    accelerators than the Newton iteration, but exact and good for any real `p`."""
    dtype = compute_dtype(matrix.dtype)
    lam, u = jnp.linalg.eigh(matrix.astype(dtype))
    lam = jnp.maximum(lam, 0)
    eps = jnp.asarray(ridge_epsilon, dtype)
    if relative_matrix_epsilon:
        eps = eps * jnp.maximum(lam[-1], jnp.asarray(1e-6, dtype))
    root = (u * (lam + eps) ** jnp.asarray(-1.0 / p, dtype)) @ u.T
    return root.astype(matrix.dtype)


# --- refresh every k steps ------------------------------------------------------------


def check_every_k(opt, name: str) -> None:
    """Check a refresh period (`every_k`'s `k`) at construction: an integer >= 1, or a
    scalar integer array (>= 1 when concrete); a tracer passes. Raises a `ValueError`
    naming the field."""
    value = getattr(opt, name)
    dtype = getattr(value, "dtype", None)
    integer = (
        isinstance(value, int)
        if dtype is None
        else jnp.issubdtype(dtype, jnp.integer) and getattr(value, "shape", ()) == ()
    )
    if isinstance(value, bool) or not integer:
        raise ValueError(
            f"`{type(opt).__name__}({name}=...)` must be an integer >= 1 (or a scalar "
            f"integer array), got {value!r}."
        )
    concrete = concrete_scalar(opt, name, value)
    if concrete is not None and concrete < 1:
        raise ValueError(
            f"`{type(opt).__name__}({name}=...)` must be >= 1, got {value!r}."
        )


def cond(pred: Array, true_fn: Callable, false_fn: Callable, *operands: Any):
    """`lax.cond(pred, true_fn, false_fn, *operands)`, with matrices crossing the
    branch boundary flat on CPU.

    XLA chooses one memory layout for each output of a `cond`. Where a branch makes a
    matrix column-major (a LAPACK result, a gather along a row), that layout wins, and
    the other branch and every row-major consumer get a transposing copy. On CPU each
    such copy is a kernel of its own per shape, costlier to compile than the work
    around it. A flat array has one layout, so matrices cross the boundary row-major
    and only data that really is column-major is transposed, once, in its branch.
    The operands are passed flat too, so that an operand a branch returns unchanged
    is still the same buffer (no copy). Pass what a branch returns as an operand, not
    by closure. This pays only where a branch does make column-major results: for
    Shampoo's inverse roots (matrix products alone) XLA copied the state instead.
    Elsewhere (other backends, whose layouts a reshape may change; arrays on a mesh,
    whose shardings it may) the `cond` is plain.
    """
    leaves, treedef = jtu.tree_flatten(operands)
    if jax.default_backend() != "cpu" or mesh_of(leaves) is not None:
        return jax.lax.cond(pred, true_fn, false_fn, *operands)
    flat = lambda xs: [x.reshape(-1) if jnp.ndim(x) > 1 else x for x in xs]
    shapes = [jnp.shape(x) for x in leaves]
    found = []

    def branch(fn):
        def run(flat_leaves):
            args = [x.reshape(shape) for x, shape in zip(flat_leaves, shapes)]
            out, out_def = jtu.tree_flatten(fn(*jtu.tree_unflatten(treedef, args)))
            if not found:
                found.append((out_def, [jnp.shape(x) for x in out]))
            return flat(out)

        return run

    out = jax.lax.cond(pred, branch(true_fn), branch(false_fn), flat(leaves))
    out_def, out_shapes = found[0]
    return jtu.tree_unflatten(
        out_def, [x.reshape(shape) for x, shape in zip(out, out_shapes)]
    )


def every_k(
    count: Array,
    k: ArrayLike,
    refresh: Callable,
    keep: Callable,
    *operands: Any,
    flat: bool = False,
):
    """`lax.cond(count % k == 0, refresh, keep, *operands)`.

    `count` is the int32 step counter from the state and `k` a Python int or an
    (integer) array, so stepping never recompiles, nor does changing `k` when it is
    an array. `refresh` and `keep` must return the same types (dtype rule 5).
    `flat=True` goes through [`cond`][], for a `refresh` that returns LAPACK's
    column-major results (QR, `eigh`, SVD); `keep` should then return its operands,
    not arrays it closes over.

    With `k` the Python int 1 (every step: Shampoo's default
    `statistics_compute_steps`) there is no `cond`: `refresh` is traced alone, which
    computes the same values, compiles one branch instead of two, and leaves no
    collective inside a `cond` for sharded params (see "Why those runs hung" in the
    scaling guide).
    """
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k == 1:
        return refresh(*operands)
    k = jnp.asarray(k, jnp.int32)
    choose = cond if flat else jax.lax.cond
    return choose(count % k == 0, refresh, keep, *operands)


# --- orthogonalization ----------------------------------------------------------------


def newton_schulz(
    x: Array, coeffs: Array, eps: ArrayLike, ns_dtype: Any = None
) -> Array:
    r"""Orthogonalize each matrix of `x`, shape `(batch, m, n)` (Muon's and NorMuon's
    Newton-Schulz iteration).

    $X \leftarrow X / (\|X\|_F + \epsilon)$, then for each row $(a, b, c)$ of
    `coeffs` (shape `(steps, 3)`): $A = X X^H$, $X \leftarrow a X + (b A + c A^2) X$
    when $m \le n$; for a tall $X$ ($m > n$) the same function with the smaller Gram
    matrix, $A = X^H X$, $X \leftarrow a X + X (b A + c A^2)$ (the first form on
    $X^H$, conjugate-transposed back).
    Runs in `ns_dtype` (default `x`'s dtype) and returns `x`'s dtype.
    """
    dtype = x.dtype
    sq = jnp.real(x * jnp.conj(x)) if jnp.iscomplexobj(x) else x * x
    norm = jnp.sqrt(jnp.sum(sq, axis=(-2, -1), keepdims=True))
    x = x / (norm + jnp.asarray(eps, norm.dtype)).astype(dtype)
    ns = dtype if ns_dtype is None else jnp.dtype(ns_dtype)
    x = x.astype(ns)
    coeffs = coeffs.astype(ns)

    tall = x.shape[-2] > x.shape[-1]

    def iteration(x, abc):
        if tall:  # the wide form on X^H, without transposing X
            a = jnp.conj(jnp.swapaxes(x, -1, -2)) @ x
            poly = abc[1] * a + abc[2] * (a @ a)
            return abc[0] * x + x @ poly, None
        a = x @ jnp.conj(jnp.swapaxes(x, -1, -2))
        poly = abc[1] * a + abc[2] * (a @ a)
        return abc[0] * x + poly @ x, None

    if x.shape[0] == 1:
        # One matrix: 2-D products, which XLA:CPU computes on the operands as they
        # are (a batched product's transposed operand would be a copy each step).
        x, _ = jax.lax.scan(iteration, x[0], coeffs)
        return x[None].astype(dtype)
    x, _ = jax.lax.scan(iteration, x, coeffs)
    return x.astype(dtype)
