"""Shampoo: blocked Kronecker-factored preconditioning with grafting, after
`distributed_shampoo` (Anil et al. 2020)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Float, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    compute_dtype,
    increment,
    is_none,
    is_param,
    out_dtype,
    resolve,
    scalar,
    sharded_like,
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
    BlockPartition,
    check_every_k,
    every_k,
    gram,
    matrix_inverse_pth_root,
    matrix_view,
    MatrixView,
    project,
)
from .spread import (
    check_spread,
    explicit_sharding,
    find_spread,
    gathered,
    mesh_of,
    replicate,
    spread_field,
    spread_map,
)


_GRAFT_TYPES = (
    "sgd",
    "adagrad",
    "rmsprop",
    "rmsprop_normalized",
    "sqrt_n",
    "adagrad_normalized",
)
_PRECONDITIONER_TYPES = ("all", "input")


def _lower(x):
    return x.lower() if isinstance(x, str) else x


@typechecked
class ShampooState(eqx.Module):
    """State of [`eqxopt.Shampoo`][].

    - `count`: the number of updates applied;
    - `statistics`: per param, a tuple of factor matrices (one per block and
        preconditioned axis, blocks in row-major order, axes in order within a
        block), `None` for params that are not preconditioned;
    - `preconditioners`: their inverse p-th roots, laid out as `statistics`;
    - `diagonal_statistics`: the grafting optimizer's accumulator (AdaGrad/RMSProp
        grafting only, else `None`), one leaf per param;
    - `diagonal_momentum`, `momentum`: the momenta of the grafting and the Shampoo
        updates, one leaf per param (these three may be quantized:
        [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((300, 200))}
        state = eqxopt.Shampoo(1e-3, block_size=128).init(params)
        # (300, 200) in blocks of at most 128: 3 x 2 blocks, 2 factors each
        assert len(state.statistics["w"]) == 12
        assert state.statistics["w"][0].shape == (128, 128)
        ```
    """

    count: Int32[Array, ""]
    statistics: PyTree[Float[Array, "_ _"]]
    preconditioners: PyTree[Float[Array, "_ _"]]
    diagonal_statistics: PyTree[Stored]
    diagonal_momentum: PyTree[Stored]
    momentum: PyTree[Stored]


class _Layout:
    """How one param is preconditioned: its (merged) view, its blocks, and which axes
    of each block get a factor."""

    def __init__(self, opt: "Shampoo", shape: tuple[int, ...]):
        self.skip = (
            len(shape) < opt.skip_preconditioning_rank_lt
            or any(d > opt.skip_preconditioning_dim_size_gt for d in shape)
            or 0 in shape  # no elements: no statistics to precondition with
        )
        self.view: MatrixView = matrix_view(
            shape,
            merge=(
                opt.merge_small_dims_block_size
                if opt.best_effort_shape_interpretation
                else None
            ),
        )
        if opt.best_effort_shape_interpretation and len(shape) == 1:
            # `merge_small_dims` also applies to rank 1 (a no-op there, except that
            # an all-ones shape becomes (1,)).
            self.view = MatrixView(shape, shape, (True,))
        self.partition = BlockPartition(self.view.view_shape, opt.block_size)
        rank = len(self.view.view_shape)
        if opt.preconditioner_type == "all" or rank <= 1:
            self.flags = (True,) * rank
        else:
            self.flags = (True,) * (rank - 1) + (False,)
        self.exponent = opt.exponent_override or 2 * sum(self.flags)

    def blocks(self, x: Array) -> list[Array]:
        """The blocks of the param-shaped `x`, in view shape. On `Explicit` mesh axes
        a leaf cut into several blocks is gathered first (a sharded axis cannot be
        split into pieces the mesh does not divide)."""
        if len(self.partition.block_shapes) > 1:
            x = gathered(x)
        return self.partition.partition(self.view.to_view(x))

    def factor_sizes(self) -> list[int]:
        return [
            d
            for block in self.partition.block_shapes
            for d, flag in zip(block, self.flags)
            if flag
        ]


class Shampoo(AbstractOptimizer[ShampooState]):
    r"""Shampoo with blocking and layer-wise grafting, after `distributed_shampoo`
    (google-research/scalable_shampoo, the JAX implementation).

    Each param is reshaped (small neighbouring axes merged while their product is at
    most `merge_small_dims_block_size`) and cut into blocks of at most `block_size`
    per axis. For each block $G$ and each axis $k$ it keeps the statistic
    $S_k \leftarrow \beta_2 S_k + (1-\beta_2) G_{(k)} G_{(k)}^\top$ (initially
    $\epsilon_m I$; $\beta_2 = 1$ sums instead), and every
    `preconditioning_compute_steps` steps the preconditioner
    $P_k = (S_k + \epsilon I)^{-1/p}$, $p = 2K$ for $K$ preconditioned axes (or
    `exponent_override`), by a coupled Newton iteration, with
    $\epsilon$ = `matrix_epsilon` $\cdot\,\lambda_{\max}(S_k)$; a root whose
    residual is NaN or at least `inverse_failure_threshold` is discarded (the
    previous one is kept). The preconditioned gradient $\tilde G = G \times_1 P_1
    \cdots \times_K P_K$ is *grafted*: rescaled per param to the norm of a simple
    optimizer's update $D$ (`graft_type`: `"sgd"` $D = g$; `"adagrad"`; `"rmsprop"`;
    their `"_normalized"` variants, which first divide $g$ by its norm; `"sqrt_n"`
    $D = \operatorname{sign}(g)$):

    $$s = \tilde G\, \frac{\|D\|}{\|\tilde G\| + 10^{-16}},\qquad
      M_s \leftarrow \beta_1 M_s + (s + \lambda W),\qquad
      M_d \leftarrow \beta_1 M_d + (D + \lambda W)$$

    and the update is $-\eta\,(\beta_1 M + (s + \lambda W))$ with Nesterov, $-\eta M$
    without, where $M = M_s$ from step `start_preconditioning_step` on and $M = M_d$
    before (both momenta are kept up to date at every step). Params of rank below
    `skip_preconditioning_rank_lt` or with an axis longer than
    `skip_preconditioning_dim_size_gt` (or with no elements) get the grafting
    update alone.

    The arguments, their order and defaults are the reference's (`beta1`, `beta2` are
    named `b1`, `b2`; `graft_type` and `preconditioner_type` are strings), so is what
    a step does.

    **Differences from the reference.** Only the data-parallel path is implemented:
    none of `batch_axis_name`, the pjit/sharded-statistics options
    (`statistics_partition_spec`, `preconditioner_partition_spec`,
    `num_devices_for_pjit`, `shard_optimizer_states`), the int8/int16 quantized
    state (`best_effort_memory_usage_reduction`), LOBPCG deflation, the `precision`
    flags (matmuls run at the highest precision) or the training metrics. Each
    statistic is inverted separately (the reference pads all of them to one size and
    batches them; the padding does not change the roots). The inverse roots run
    in float64 with `jax_enable_x64` and in float32 without, as the reference's
    (`root_dtype` overrides this). The reference keeps every buffer in
    float32; here statistics and preconditioners have `precond_dtype` (default
    `state_dtype`, else the param's (no state buffer is wider than the
    params; pass `precond_dtype=jnp.float32` for float16/bfloat16 params) and the
    momenta and diagonal statistics mirror the params (their dtype, or
    `state_dtype`).

    **State memory.** For an `(m, n)` matrix leaf that is not merged (`m n >
    merge_small_dims_block_size`) and whose blocks are $(m_b, n_b)$: the statistics
    and preconditioners hold $2\sum_b (m_b^2 + n_b^2)$ entries of `precond_dtype`
    (without blocking, $2(m^2 + n^2)$), the two momenta $2mn$ entries of
    `state_dtype` (the param's by default), plus $mn$ for the diagonal statistics
    with AdaGrad/RMSProp grafting; plus 4 bytes for the count. A merged leaf counts as
    its merged shape (a small `(m, n)` leaf becomes a vector of $mn$ with one
    $(mn)^2$ factor). A leaf that is not preconditioned (rank below
    `skip_preconditioning_rank_lt`, e.g. a scalar, or an axis longer than
    `skip_preconditioning_dim_size_gt`) has the momenta (and diagonal statistics)
    alone.

    With `jit` and sharded params, the momenta are sharded like the params; the
    factor matrices are replicated (see [`eqxopt.state_shardings`][]). Their inverse
    roots are spread over the mesh's devices, each computing its share of the
    same-shape factors (`spread`).

    ??? cite "References"

        ```bibtex
        @article{anil2020scalable,
            title={Scalable Second Order Optimization for Deep Learning},
            author={Anil, Rohan and Gupta, Vineet and Koren, Tomer and Regan, Kevin
                and Singer, Yoram},
            journal={arXiv:2002.09018}, year={2020}}

        @inproceedings{gupta2018shampoo,
            title={Shampoo: Preconditioned Stochastic Tensor Optimization},
            author={Gupta, Vineet and Koren, Tomer and Singer, Yoram},
            booktitle={ICML}, year={2018}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((80, 60)), "b": jnp.zeros(60)}
        grads = {"w": jnp.full((80, 60), 0.1), "b": jnp.ones(60)}
        opt = eqxopt.Shampoo(1e-3, block_size=32, graft_type="rmsprop_normalized")
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    block_size: int = eqx.field(default=1024, static=True)
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    diagonal_epsilon: ScalarLike = 1e-10
    matrix_epsilon: ScalarLike = 1e-6
    weight_decay: ScalarLike = 0.0
    start_preconditioning_step: ScalarLike = 5
    preconditioning_compute_steps: ScalarLike = 1
    statistics_compute_steps: ScalarLike = 1
    best_effort_shape_interpretation: bool = eqx.field(default=True, static=True)
    graft_type: str = eqx.field(default="sgd", static=True, converter=_lower)
    nesterov: bool = eqx.field(default=True, static=True)
    exponent_override: int = eqx.field(default=0, static=True)
    inverse_failure_threshold: ScalarLike = 0.1
    moving_average_for_momentum: bool = eqx.field(default=False, static=True)
    skip_preconditioning_dim_size_gt: int = eqx.field(default=4096, static=True)
    clip_by_scaled_gradient_norm: ScalarLike | None = None
    relative_matrix_epsilon: bool = eqx.field(default=True, static=True)
    merge_small_dims_block_size: int = eqx.field(default=4096, static=True)
    preconditioner_type: str = eqx.field(default="all", static=True, converter=_lower)
    skip_preconditioning_rank_lt: int = eqx.field(default=1, static=True)
    decoupled_learning_rate: bool = eqx.field(default=True, static=True)
    decoupled_weight_decay: bool = eqx.field(default=False, static=True)
    precond_dtype: Any = eqx.field(default=None, static=True)
    state_dtype: Any = eqx.field(default=None, static=True)
    root_dtype: Any = eqx.field(default=None, static=True)
    spread: bool | str | tuple[str, ...] = spread_field()

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=(
                "learning_rate",
                "diagonal_epsilon",
                "matrix_epsilon",
                "weight_decay",
                "start_preconditioning_step",
            ),
            positive=("inverse_failure_threshold", "clip_by_scaled_gradient_norm"),
            unit_interval=("b1",),
            closed_unit_interval=("b2",),
            positive_int=(
                "block_size",
                "merge_small_dims_block_size",
                "skip_preconditioning_dim_size_gt",
            ),
            choices={
                "graft_type": _GRAFT_TYPES,
                "preconditioner_type": _PRECONDITIONER_TYPES,
            },
        )
        for name in ("preconditioning_compute_steps", "statistics_compute_steps"):
            check_every_k(self, name)
        check_spread(self)
        for name in ("exponent_override", "skip_preconditioning_rank_lt"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(
                    f"`Shampoo({name}=...)` must be an integer >= 0, got {v!r}."
                )
        for name in ("precond_dtype", "state_dtype", "root_dtype"):
            value = getattr(self, name)
            if name == "state_dtype" and plain_dtype(value) is None:
                continue  # quantized or per-buffer: checked against the buffers
            try:
                ok = value is None or jnp.issubdtype(value, jnp.floating)
            except TypeError:
                ok = False
            if not ok:
                raise ValueError(
                    f"`Shampoo({name}=...)` must be a floating dtype or None, got "
                    f"{value!r}."
                )

    def _root_dtype(self, s):
        if self.root_dtype is not None:
            return compute_dtype(s.dtype, self.root_dtype)
        # The reference's `_MAT_INV_PTH_ROOT_DTYPE = jnp.float64`, which is float32
        # without x64.
        return compute_dtype(
            s.dtype, jnp.float64 if jax.config.read("jax_enable_x64") else jnp.float32
        )

    def _has_diagonal(self) -> bool:
        return self.graft_type not in ("sgd", "sqrt_n")

    def _param_buffers(self) -> dict[str, bool]:
        diagonal = {"diagonal_statistics": True} if self._has_diagonal() else {}
        return diagonal | {"diagonal_momentum": False, "momentum": False}

    def _pdtype(self, p):
        # dtype rule 8: no state buffer wider than the params (or `state_dtype`).
        plain = plain_dtype(self.state_dtype)
        return jnp.dtype(self.precond_dtype or plain or p.dtype)

    real_only = (
        "its preconditioners are inverse roots of real symmetric statistics, as in "
        "the reference"
    )

    def init(self, params: Params) -> ShampooState:
        leaves, treedef = jtu.tree_flatten(params, is_leaf=is_none)
        stats, precs, diag, dmom, mom = [], [], [], [], []
        for p in leaves:
            if not is_param(p):
                for lst in (stats, precs, diag, dmom, mom):
                    lst.append(None)
                continue
            layout = _Layout(self, tuple(p.shape))
            if layout.skip:
                stats.append(None)
                precs.append(None)
            else:
                dtype = self._pdtype(p)
                eps = jnp.asarray(self.matrix_epsilon, dtype)
                sizes = layout.factor_sizes()
                stats.append(tuple(eps * jnp.eye(d, dtype=dtype) for d in sizes))
                precs.append(tuple(jnp.eye(d, dtype=dtype) for d in sizes))
            buffer = lambda name, nonnegative: new_buffer(
                p, 0, storage_of(self.state_dtype, name), nonnegative
            )
            diag.append(
                buffer("diagonal_statistics", True) if self._has_diagonal() else None
            )
            dmom.append(buffer("diagonal_momentum", False))
            mom.append(buffer("momentum", False))
        unflatten = lambda xs: jtu.tree_unflatten(treedef, xs)
        return ShampooState(
            zero_count(),
            unflatten(stats),
            unflatten(precs),
            unflatten(diag),
            unflatten(dmom),
            unflatten(mom),
        )

    def update(
        self, grads: Updates, state: ShampooState, params: Params | None = None, **extra
    ) -> tuple[Updates, ShampooState]:
        del extra
        step = state.count
        wd = self.weight_decay
        use_wd = not (isinstance(wd, (int, float)) and wd == 0)
        if use_wd:
            need_params(self, params, "for the weight decay")
        lr = resolve(self.learning_rate, step)
        g_leaves, treedef = jtu.tree_flatten(grads, is_leaf=is_none)
        flat = lambda tree: treedef.flatten_up_to(tree)
        p_leaves = [None] * len(g_leaves) if params is None else flat(params)
        stats_l, precs_l = flat(state.statistics), flat(state.preconditioners)
        diag_l, dmom_l, mom_l = (
            flat(state.diagonal_statistics),
            flat(state.diagonal_momentum),
            flat(state.momentum),
        )
        idx = [i for i, g in enumerate(g_leaves) if is_param(g)]
        layouts = {i: _Layout(self, tuple(g_leaves[i].shape)) for i in idx}
        pre_idx = [i for i in idx if stats_l[i] is not None]
        spread = find_spread(self.spread, [g_leaves[i] for i in idx], "Shampoo")

        # 1. Statistics (every `statistics_compute_steps` steps).
        def new_statistics(_):
            out = []
            for i in pre_idx:
                layout, g = layouts[i], g_leaves[i]
                dtype = compute_dtype(g.dtype, *(s.dtype for s in stats_l[i]))
                b2 = scalar(self.b2, dtype)
                w2 = jnp.where(b2 == 1, b2, 1 - b2)
                blocks = layout.blocks(g.astype(dtype))
                it = iter(stats_l[i])
                new = []
                for block in blocks:
                    for k, flag in enumerate(layout.flags):
                        if flag:
                            old = next(it)
                            s = b2 * old.astype(dtype) + w2 * gram(block, k)
                            new.append(s.astype(old.dtype))
                out.append(tuple(new))
            return out

        old_stats = [stats_l[i] for i in pre_idx]
        if pre_idx:
            stats_new = every_k(
                step,
                self.statistics_compute_steps,
                new_statistics,
                lambda _: old_stats,
                None,
            )
        else:
            stats_new = []

        # 2. Preconditioners (every `preconditioning_compute_steps` steps); a root
        #    whose residual is NaN or >= inverse_failure_threshold is not used.
        def new_preconditioner(exponent, shared, s, old):
            ridge_epsilon, failure_threshold = shared
            root, error = matrix_inverse_pth_root(
                s.astype(self._root_dtype(s)),
                exponent,
                ridge_epsilon=ridge_epsilon,
                relative_matrix_epsilon=self.relative_matrix_epsilon,
            )
            threshold = scalar(failure_threshold, jnp.float32)
            failed = jnp.isnan(error) | (error >= threshold)
            return jnp.where(failed, old, root.astype(old.dtype))

        def new_preconditioners(stats):
            # Every block's root at once, spread over the mesh (see `spread`).
            tasks = [
                (layouts[i].exponent, (s, old))
                for i, s_leaf in zip(pre_idx, stats)
                for s, old in zip(s_leaf, precs_l[i])
            ]
            shared = (self.matrix_epsilon, self.inverse_failure_threshold)
            roots = iter(spread_map(new_preconditioner, tasks, spread, shared=shared))
            return [tuple(next(roots) for _ in precs_l[i]) for i in pre_idx]

        old_precs = [precs_l[i] for i in pre_idx]
        if pre_idx:
            precs_new = every_k(
                step,
                self.preconditioning_compute_steps,
                new_preconditioners,
                lambda _: old_precs,
                stats_new,
            )
        else:
            precs_new = []
        stats_out, precs_out = list(stats_l), list(precs_l)
        # Factor matrices replicated over the params' mesh, as `state_shardings`
        # predicts (XLA would otherwise pick their shardings).
        stats_new, precs_new = replicate(
            (stats_new, precs_new), mesh_of([g_leaves[i] for i in idx])
        )
        for i, s, p in zip(pre_idx, stats_new, precs_new):
            stats_out[i], precs_out[i] = s, p

        # 3. Grafting, momentum and the update.
        updates: list[Any] = [None] * len(g_leaves)
        diag_out, dmom_out, mom_out = list(diag_l), list(dmom_l), list(mom_l)
        for i in idx:
            g, param, layout = g_leaves[i], p_leaves[i], layouts[i]
            dtype = compute_dtype(g.dtype, dtype_of(mom_l[i]))
            b1, b2 = scalar(self.b1, dtype), scalar(self.b2, dtype)
            grad = g.astype(dtype)
            norm = lambda x: jnp.sqrt(jnp.sum(x * x))
            if self.graft_type in ("adagrad", "adagrad_normalized"):
                scaled = grad
                if self.graft_type == "adagrad_normalized":
                    scaled = grad / (norm(grad) + scalar(1e-16, dtype))
                new_diag = read(diag_l[i], dtype) + scaled * scaled
                graft = scaled / (
                    jnp.sqrt(new_diag) + scalar(self.diagonal_epsilon, dtype)
                )
                diag_out[i] = write(new_diag, diag_l[i])
            elif self.graft_type in ("rmsprop", "rmsprop_normalized"):
                scaled = grad
                if self.graft_type == "rmsprop_normalized":
                    scaled = grad / (norm(grad) + scalar(1e-16, dtype))
                w2 = jnp.where(b2 == 1, b2, 1 - b2)
                new_diag = b2 * read(diag_l[i], dtype) + w2 * scaled * scaled
                graft = scaled / (
                    jnp.sqrt(new_diag) + scalar(self.diagonal_epsilon, dtype)
                )
                if self.clip_by_scaled_gradient_norm is not None:
                    scaled_norm = norm(graft) / jnp.sqrt(scalar(graft.size, dtype))
                    graft = graft / jnp.maximum(
                        scalar(1, dtype),
                        scaled_norm / scalar(self.clip_by_scaled_gradient_norm, dtype),
                    )
                diag_out[i] = write(new_diag, diag_l[i])
            elif self.graft_type == "sgd":
                graft = grad
            else:  # sqrt_n
                graft = jnp.sign(grad)
            lr_ = scalar(lr, dtype)
            if not self.decoupled_learning_rate:
                graft = graft * lr_
            if stats_out[i] is None:
                precond = graft
            else:
                blocks = layout.blocks(grad)
                it = iter(precs_out[i])
                out_blocks = []
                for block in blocks:
                    bases = [next(it) if flag else None for flag in layout.flags]
                    out_blocks.append(project(block, bases))
                precond = layout.view.from_view(layout.partition.merge(out_blocks))
                # On `Explicit` mesh axes a contraction along a sharded axis gives a
                # replicated result: sharded like the grad again (a local slice), as
                # the `where`s below need operands of one sharding.
                sharding = explicit_sharding(grad)
                if sharding is not None:
                    precond = jax.sharding.reshard(precond, sharding)
            multiplier = norm(graft) / (norm(precond) + scalar(1e-16, dtype))
            shampoo = precond * multiplier
            if use_wd and not self.decoupled_weight_decay:
                assert param is not None
                wd_p = scalar(wd, dtype) * param.astype(dtype)
                shampoo = shampoo + wd_p
                graft = graft + wd_p
            w = (1 - b1) if self.moving_average_for_momentum else scalar(1, dtype)
            shampoo_mom = read(mom_l[i], dtype) * b1 + w * shampoo
            graft_mom = read(dmom_l[i], dtype) * b1 + w * graft
            run = step >= jnp.asarray(self.start_preconditioning_step, jnp.int32)
            momentum_update = jnp.where(run, shampoo_mom, graft_mom)
            # (The graft is split like its buffers under `shard_over`, as the
            # momenta are: the preconditioned direction is sliced to match.)
            wd_update = jnp.where(run, sharded_like(shampoo, graft), graft)
            direction = momentum_update
            if self.nesterov:
                direction = w * wd_update + b1 * momentum_update
            if use_wd and self.decoupled_weight_decay:
                assert param is not None
                direction = direction + lr_ * scalar(wd, dtype) * param.astype(dtype)
            if self.decoupled_learning_rate:
                direction = lr_ * direction
            updates[i] = (-direction).astype(out_dtype(g, param))
            dmom_out[i] = write(graft_mom, dmom_l[i])
            mom_out[i] = write(shampoo_mom, mom_l[i])

        unflatten = lambda xs: jtu.tree_unflatten(treedef, xs)
        return unflatten(updates), ShampooState(
            increment(step),
            unflatten(stats_out),
            unflatten(precs_out),
            unflatten(diag_out),
            unflatten(dmom_out),
            unflatten(mom_out),
        )


Shampoo.__init__.__doc__ = r"""**Arguments:** (the reference's, in its order)

- `learning_rate`: $\eta$; a number, an array or a schedule `count -> scalar`.
- `block_size`: blocks of at most this size per axis (default `1024`). (Static.)
- `b1`: momentum $\beta_1$ in `[0, 1)` (the reference's `beta1`); default `0.9`.
- `b2`: the statistics' decay $\beta_2$ in `[0, 1]` (`beta2`); `1` sums them
    (AdaGrad-style). Default `0.999`.
- `diagonal_epsilon`: $\epsilon$ of AdaGrad/RMSProp grafting; default `1e-10`.
- `matrix_epsilon`: ridge added before the inverse root, relative to the largest
    eigenvalue with `relative_matrix_epsilon=True`; also the statistics' initial
    value $\epsilon_m I$. Default `1e-6`.
- `weight_decay`: $\lambda$; added to both updates before momentum, or decoupled
    (multiplied by the learning rate) with `decoupled_weight_decay=True`. Default `0`.
- `start_preconditioning_step`: steps before this use the grafting update
    (default `5`).
- `preconditioning_compute_steps`: recompute the inverse roots every this many
    steps (default `1`); an integer or integer array.
- `statistics_compute_steps`: update the statistics every this many steps (default
    `1`).
- `best_effort_shape_interpretation`: merge small neighbouring axes (default
    `True`). (Static.)
- `graft_type`: `"sgd"` (default), `"adagrad"`, `"rmsprop"`, `"rmsprop_normalized"`,
    `"sqrt_n"` or `"adagrad_normalized"` (the reference's `GraftingType` names, any
    case). (Static.)
- `nesterov`: Nesterov momentum (default `True`). (Static.)
- `exponent_override`: use $p$ = this instead of twice the number of factors (`0`:
    no override). (Static.)
- `inverse_failure_threshold`: an inverse root whose residual $\max|M - I|$ is at
    least this is discarded (default `0.1`).
- `moving_average_for_momentum`: momentum as an EMA ($(1-\beta_1)$ on the new term)
    instead of a sum. (Static.)
- `skip_preconditioning_dim_size_gt`: params with an axis longer than this get the
    grafting update (default `4096`). (Static.)
- `clip_by_scaled_gradient_norm`: with RMSProp grafting, clip the grafting update's
    RMS to this (default `None`).
- `relative_matrix_epsilon`: see `matrix_epsilon` (default `True`). (Static.)
- `merge_small_dims_block_size`: the size up to which axes are merged (default
    `4096`). (Static.)
- `preconditioner_type`: `"all"` (default) or `"input"` (no factor for the last
    axis; the reference's `precondtioner_type`). (Static.)
- `skip_preconditioning_rank_lt`: params of lower rank get the grafting update
    (default `1`: only scalars). (Static.)
- `decoupled_learning_rate`: apply $\eta$ after the momentum (default `True`), or to
    the grafting update before it. (Static.)
- `decoupled_weight_decay`: see `weight_decay` (default `False`). (Static.)
- `precond_dtype`: dtype of the statistics and preconditioners; default
    `state_dtype`, else the param's (the reference's is float32: pass `jnp.float32`
    for float16/bfloat16 params). (Static.)
- `state_dtype`: dtype of the momenta and diagonal statistics; default the param's.
    An [`eqxopt.Quantized`][] quantizes them, a dict keyed by `"momentum"`,
    `"diagonal_momentum"` and `"diagonal_statistics"` each; the statistics and
    preconditioners then default to the param's dtype. (Static.)
- `root_dtype`: dtype the inverse p-th roots are computed in (never below the
    statistics'); default float64 when `jax_enable_x64` is on, else float32, as the
    reference. (Static.)
- `spread`: under `jit` with params on a mesh, how the devices share the per-matrix
    work (the inverse p-th roots): `True` (default) stacks same-shape matrices and
    splits the stacks over every mesh axis (each device computes its share, the
    results are all-gathered); a mesh axis name or a tuple of names uses those axes;
    `False` repeats the work on every device. (Static.)
"""
