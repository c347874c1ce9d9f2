"""SOAP: Adam in the eigenbasis of Shampoo's preconditioner (Vyas et al. 2024)."""

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
    zeros_like_leaf,
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
    check_every_k,
    eigh_basis,
    every_k,
    gram,
    matrix_view,
    MatrixView,
    project,
    project_back,
    qr_power_basis,
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
    take,
)


@typechecked
class SOAPState(eqx.Module):
    """State of [`eqxopt.SOAP`][].

    - `count`: the number of `update` calls (the first only sets up the
        preconditioner, so Adam's step $t$ is `count` from the second call on);
    - `mu`, `nu`: Adam's moments, in the rotated basis, one leaf per param (param
        dtype, or `state_dtype`; [`eqxopt.QuantizedArray`][]s if it quantizes them);
    - `preconditioners`: per param, a tuple with one factor matrix $L_k$ (the EMA of
        $G_{(k)} G_{(k)}^\\top$) per axis of its view, `None` for axes that are not
        preconditioned; `None` for a leaf with no preconditioned axis;
    - `bases`: the eigenbases $Q_k$ of the factor matrices, laid out as
        `preconditioners`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
        state = eqxopt.SOAP().init(params)
        assert [q.shape for q in state.bases["w"]] == [(4, 4), (3, 3)]
        assert state.bases["b"] is None  # 1-D: plain Adam (precondition_1d=False)
        assert state.mu["w"].shape == (4, 3)
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Stored]
    nu: PyTree[Stored]
    preconditioners: PyTree[Float[Array, "_ _"]]
    bases: PyTree[Float[Array, "_ _"]]


def _rotate(flags: tuple[bool, ...], shared, mu: Array, *bases: Array) -> Array:
    """`mu` (in the bases `old`) in the bases `new`: `bases` holds the old bases of the
    axes whose `flags` are set, then their new ones."""
    n = len(bases) // 2
    old, new = iter(bases[:n]), iter(bases[n:])
    old_bases = [next(old) if f else None for f in flags]
    new_bases = [next(new) if f else None for f in flags]
    return project(project_back(mu, old_bases), new_bases)


def _factors(idx, precs) -> list[tuple[int, int]]:
    """`(leaf, axis)` of every factor matrix among the leaves `idx`."""
    return [
        (i, k)
        for i in idx
        if precs[i] is not None
        for k, m in enumerate(precs[i])
        if m is not None
    ]


def _leaves(tree, treedef):
    return treedef.flatten_up_to(tree)


class SOAP(AbstractOptimizer[SOAPState]):
    r"""SOAP (ShampoO with Adam in the Preconditioner's eigenbasis).

    For each param, viewed as a tensor $G$ with axes $k = 1..K$ (a matrix: $K=2$), SOAP
    keeps a factor $L_k \leftarrow \beta_s L_k + (1-\beta_s) G_{(k)} G_{(k)}^\top$ per
    axis (Shampoo's statistics) and an orthogonal basis $Q_k$ of its eigenvectors,
    and runs Adam on the rotated gradient $\tilde G = G \times_1 Q_1^\top \cdots
    \times_K Q_K^\top$ (for a matrix, $Q_L^\top G Q_R$):

    $$m_t = \beta_1 m_{t-1} + (1-\beta_1)\tilde G_t,\qquad
      v_t = \beta_2 v_{t-1} + (1-\beta_2)\tilde G_t^2$$

    $$u_t = -\eta\,\frac{\sqrt{1-\beta_2^t}}{1-\beta_1^t}\;
      \frac{m_t}{\sqrt{v_t}+\epsilon}\times_1 Q_1 \cdots \times_K Q_K,
      \qquad W_{t+1} = (W_t + u_t)(1 - \eta\lambda).$$

    As in the authors' `soap.py` (github nikhilvyas/SOAP), which this follows step
    by step:

    - the **first** `update` only accumulates $L_k$ from the gradient and sets
        $Q_k$ to its eigenvectors (`eigh`, descending eigenvalues); it returns zero
        updates, so the gradient is never used in its own projection;
    - afterwards, every `update` takes the Adam step with the current $Q_k$, then
        updates $L_k$; every `precondition_frequency` Adam steps ($t \bmod f = 0$) each
        $Q_k$ is refreshed by one power iteration and a QR decomposition
        ($Q_k \leftarrow \operatorname{qr}(L_k Q_k)$, columns first sorted by the
        estimated eigenvalues $\operatorname{diag}(Q_k^\top L_k Q_k)$, with $v$'s
        entries permuted alike), and $m$ is carried over into the new basis;
    - an axis longer than `max_precond_dim` has no factor (it is not rotated); a 1-D
        param is preconditioned only with `precondition_1d=True` (else it gets plain
        Adam); a 0-D param gets plain Adam; with `merge_dims=True` neighbouring axes
        are first merged while their product is at most `max_precond_dim`;
    - weight decay is decoupled and applied after the Adam step, to the stepped
        weights, with the learning rate (not the bias-corrected step size);
    - with `normalize_grads=True` the rotated-back Adam direction is divided by its
        RMS per param (the reference adds $10^{-30}$ to the RMS; here a zero
        direction stays zero, see below).

    Layout: Equinox's `(out, in)` layout is PyTorch's, so $L$ is `(out, out)` and $R$
    is `(in, in)` as in the reference.

    **Differences from the reference.** The reference projects $m$ back to the
    original space and forward again after every step, a round trip through the same
    orthogonal $Q$ that is the identity up to rounding; here it is done only when $Q$
    changes. The reference's `data_format="channels_last"` (a transposition of 4-D
    conv kernels before merging) is not offered: Equinox's conv kernels are
    channels-first. `eigh` and QR run in float32 or wider (the reference retries
    `eigh` in float64 when float32 fails). The reference keeps factor matrices and
    bases in float32 whatever the params' dtype; here they have the params' dtype by
    default (no state buffer is wider than the params), so for float16 or
    bfloat16 params pass `precond_dtype=jnp.float32` (or `state_dtype=jnp.float32`,
    which both follow) to get the reference's precision. The moments have the
    param's dtype (`state_dtype` sets them), as in the reference. With
    `normalize_grads=True`, a param whose gradients have all been zero (a LoRA factor
    facing a zero-initialised one) gets a zero step: the reference's
    $d / (10^{-30} + \mathrm{rms}(d))$, compiled by XLA, is NaN there (XLA merges it
    with the Adam quotient into one whose denominator underflows to 0).

    **State memory.** For an `(m, n)` matrix leaf with `m, n <= max_precond_dim`:
    $2mn$ moment entries (`state_dtype`, default the param's) plus $2(m^2 + n^2)$
    factor and basis entries (`precond_dtype`, default `state_dtype`, else the
    param's), i.e.
    $2mn\,b_s + 2(m^2+n^2)\,b_p$ bytes, plus 4 bytes for the count. An axis longer
    than `max_precond_dim` contributes no factor; a leaf with none (a 1-D leaf
    without `precondition_1d`, a 0-D leaf) has the two moments alone, $2\,
    \mathrm{size}\,b_s$.

    With `jit` and sharded params, the moments are sharded like the params; the factor
    matrices and bases are replicated (see [`eqxopt.state_shardings`][]). Their eigh
    and QR are spread over the mesh's devices, each computing its share of the
    same-shape factors (`spread`).

    ??? cite "References"

        ```bibtex
        @article{vyas2024soap,
            title={{SOAP}: Improving and Stabilizing Shampoo using Adam},
            author={Vyas, Nikhil and Morwani, Depen and Zhao, Rosie and Kwun, Mujin
                and Shapira, Itai and Brandfonbrener, David and Janson, Lucas and
                Kakade, Sham},
            journal={arXiv:2409.11321}, year={2024}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.arange(12.0).reshape(4, 3) / 10, "b": jnp.ones(3)}
        opt = eqxopt.SOAP(3e-3, precondition_frequency=10)
        state = opt.init(params)
        new, state = opt.step(params, grads, state)  # first step: no update
        assert (new["w"] == params["w"]).all()
        new, state = opt.step(new, grads, state)  # Adam in the rotated basis
        ```
    """

    learning_rate: ScalarOrSchedule = 3e-3
    b1: ScalarLike = 0.95
    b2: ScalarLike = 0.95
    shampoo_beta: ScalarLike | None = None
    eps: ScalarLike = 1e-8
    weight_decay: ScalarOrSchedule = 0.01
    precondition_frequency: ScalarLike = 10
    max_precond_dim: int = eqx.field(default=10000, static=True)
    merge_dims: bool = eqx.field(default=False, static=True)
    precondition_1d: bool = eqx.field(default=False, static=True)
    normalize_grads: bool = eqx.field(default=False, static=True)
    correct_bias: bool = eqx.field(default=True, static=True)
    precond_dtype: Any = eqx.field(default=None, static=True)
    state_dtype: Any = eqx.field(default=None, static=True)
    spread: bool | str | tuple[str, ...] = spread_field()

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "eps", "weight_decay"),
            unit_interval=("b1", "b2"),
            closed_unit_interval=("shampoo_beta",),
            positive_int=("max_precond_dim",),
        )
        check_every_k(self, "precondition_frequency")
        check_spread(self)
        for name in ("precond_dtype", "state_dtype"):
            value = getattr(self, name)
            if name == "state_dtype" and plain_dtype(value) is None:
                continue  # quantized or per-buffer: checked against `_state_buffers`
            try:
                ok = value is None or jnp.issubdtype(value, jnp.floating)
            except TypeError:
                ok = False
            if not ok:
                raise ValueError(
                    f"`SOAP({name}=...)` must be a floating dtype or None, got "
                    f"{value!r}."
                )

    # Adam's moments, of the params' shapes (in the rotated basis).
    _state_buffers = {"mu": False, "nu": True}

    # -- layout ------------------------------------------------------------------

    def _view(self, p) -> MatrixView:
        return matrix_view(
            p.shape,
            max_dim=self.max_precond_dim,
            merge=self.max_precond_dim if self.merge_dims else None,
            precondition_1d=self.precondition_1d,
        )

    def _pdtype(self, p):
        # dtype rule 8: no state buffer wider than the params (or `state_dtype`).
        return jnp.dtype(self.precond_dtype or plain_dtype(self.state_dtype) or p.dtype)

    # -- protocol ----------------------------------------------------------------

    real_only = (
        "its eigenbases are those of real symmetric statistics, as in the reference"
    )

    def init(self, params: Params) -> SOAPState:
        leaves, treedef = jtu.tree_flatten(params, is_leaf=is_none)
        mu, nu, precs, bases = [], [], [], []
        for p in leaves:
            if not is_param(p):
                for lst in (mu, nu, precs, bases):
                    lst.append(None)
                continue
            mu.append(new_buffer(p, 0, storage_of(self.state_dtype, "mu"), False))
            nu.append(new_buffer(p, 0, storage_of(self.state_dtype, "nu"), True))
            view = self._view(p)
            if not view.any:
                precs.append(None)
                bases.append(None)
                continue
            dtype = self._pdtype(p)
            precs.append(
                tuple(
                    jnp.zeros((d, d), dtype) if flag else None
                    for d, flag in zip(view.view_shape, view.preconditioned)
                )
            )
            bases.append(
                tuple(
                    jnp.eye(d, dtype=dtype) if flag else None
                    for d, flag in zip(view.view_shape, view.preconditioned)
                )
            )
        unflatten = lambda xs: jtu.tree_unflatten(treedef, xs)
        return SOAPState(
            zero_count(),
            unflatten(mu),
            unflatten(nu),
            unflatten(precs),
            unflatten(bases),
        )

    def update(
        self, grads: Updates, state: SOAPState, params: Params | None = None, **extra
    ) -> tuple[Updates, SOAPState]:
        del extra
        count = state.count
        wd = resolve(self.weight_decay, count)
        use_wd = not (isinstance(wd, (int, float)) and wd == 0)
        if use_wd:
            need_params(self, params, "for the weight decay")
        lr = resolve(self.learning_rate, count)
        shampoo_beta = self.b2 if self.shampoo_beta is None else self.shampoo_beta

        g_leaves, treedef = jtu.tree_flatten(grads, is_leaf=is_none)
        p_leaves = (
            [None] * len(g_leaves) if params is None else _leaves(params, treedef)
        )
        mu_l, nu_l = _leaves(state.mu, treedef), _leaves(state.nu, treedef)
        pre_l, q_l = (
            _leaves(state.preconditioners, treedef),
            _leaves(state.bases, treedef),
        )
        idx = [i for i, g in enumerate(g_leaves) if is_param(g)]
        views = {i: self._view(g_leaves[i]) for i in idx}
        spread = find_spread(self.spread, [g_leaves[i] for i in idx], "SOAP")

        def stats(i, g):
            """The factor matrices updated with `g` (in view shape, compute dtype)."""
            if pre_l[i] is None:
                return None
            out = []
            for k, old in enumerate(pre_l[i]):
                if old is None:
                    out.append(None)
                    continue
                dtype = compute_dtype(g.dtype, old.dtype)
                w = 1 - scalar(shampoo_beta, dtype)
                o = old.astype(dtype)
                new = o + w * (gram(g.astype(dtype), k) - o)
                out.append(new.astype(old.dtype))
            return tuple(out)

        # The factor matrices, updated with this step's grads, are the same in both
        # branches of the first-step `cond` when both compute in one dtype: computed
        # once, before it (one copy of every leaf's Gram matrices in the program,
        # not two).
        hoisted = {}
        for i in idx:
            dtype = compute_dtype(g_leaves[i].dtype)
            if dtype == compute_dtype(g_leaves[i].dtype, dtype_of(mu_l[i])):
                gv = views[i].to_view(g_leaves[i].astype(dtype))
                hoisted[i] = stats(i, gv)

        def stats_of(i, gv):
            return hoisted[i] if i in hoisted else stats(i, gv)

        def first(_):
            # The reference's first step: accumulate the factors, eigh, no update.
            precs, bases = list(pre_l), list(q_l)
            updates: list[Any] = [None] * len(g_leaves)
            for i in idx:
                g = g_leaves[i]
                gv = views[i].to_view(g.astype(compute_dtype(g.dtype)))
                precs[i] = stats_of(i, gv)
                p = p_leaves[i]
                # Typed like the momentum, as `regular`'s (the `cond`'s two branches):
                # the grad's sharding, or the momentum's split of it (`shard_over`).
                zeros = zeros_like_leaf(g, out_dtype(g, p))
                updates[i] = sharded_like(zeros, mu_l[i])
            # Every factor's eigh at once, spread over the mesh (see `spread`).
            where = _factors(idx, precs)
            found = spread_map(
                lambda _, shared, m: eigh_basis(m),
                [(None, (precs[i][k],)) for i, k in where],
                spread,
                decomposition=True,
            )
            new = {ik: q for ik, q in zip(where, found)}
            for i in idx:
                if precs[i] is not None:
                    bases[i] = tuple(
                        None if m is None else new[i, k] for k, m in enumerate(precs[i])
                    )
            return updates, list(mu_l), list(nu_l), precs, bases

        def regular(_):
            t = count
            updates: list[Any] = [None] * len(g_leaves)
            mus: list[Any] = list(mu_l)
            nus: list[Any] = list(nu_l)
            precs: list[Any] = list(pre_l)
            for i in idx:
                g, p, view = g_leaves[i], p_leaves[i], views[i]
                dtype = compute_dtype(g.dtype, dtype_of(mu_l[i]))
                b1, b2 = scalar(self.b1, dtype), scalar(self.b2, dtype)
                bases = q_l[i] if q_l[i] is not None else ()
                gv = view.to_view(g.astype(dtype))
                gp = project(gv, bases)
                m = b1 * view.to_view(read(mu_l[i], dtype)) + (1 - b1) * gp
                v = b2 * view.to_view(read(nu_l[i], dtype)) + (1 - b2) * gp * gp
                denom = jnp.sqrt(v) + scalar(self.eps, dtype)
                step = scalar(lr, dtype)
                if self.correct_bias:
                    tt = t.astype(dtype)
                    step = step * jnp.sqrt(1 - b2**tt) / (1 - b1**tt)
                direction = view.from_view(project_back(m / denom, bases))
                if self.normalize_grads:
                    # The reference divides by 1e-30 + rms. XLA rewrites that
                    # quotient of quotients into m / (denom * (1e-30 + rms)), which
                    # flushes to 0 when rms is 0 (zero grads): 0 / 0. A zero
                    # direction stays zero instead.
                    rms = jnp.sqrt(jnp.mean(direction * direction))
                    direction = jnp.where(
                        rms > 0, direction / rms, jnp.zeros((), dtype)
                    )
                u = -step * direction
                if use_wd:
                    assert p is not None
                    u = u - scalar(lr, dtype) * scalar(wd, dtype) * (
                        p.astype(dtype) + u
                    )
                updates[i] = sharded_like(u.astype(out_dtype(g, p)), mu_l[i])
                mus[i] = m
                nus[i] = v
                precs[i] = stats_of(i, gv)

            def refresh(carry):
                mus, nus, q_l = list(carry[0]), list(carry[1]), list(carry[2])
                bases = list(q_l)
                # Every factor's power iteration and QR at once, spread over the
                # mesh (see `spread`).
                where = _factors(idx, precs)
                found = spread_map(
                    lambda _, shared, m, q: qr_power_basis(m, q),
                    [(None, (precs[i][k], q_l[i][k])) for i, k in where],
                    spread,
                    decomposition=True,
                )
                qr = {ik: out for ik, out in zip(where, found)}
                for i in idx:
                    if precs[i] is None:
                        continue
                    new, v = [], nus[i]
                    for k, mat in enumerate(precs[i]):
                        if mat is None:
                            new.append(None)
                            continue
                        q_new, order = qr[i, k]
                        v = take(v, order, axis=k)
                        new.append(q_new)
                    bases[i] = tuple(new)
                    nus[i] = v
                # The momentum, from the old bases into the new ones (spread too).
                # On `Explicit` mesh axes it is gathered for the rotation (whose
                # contractions along sharded axes would need output shardings) and
                # sharded again afterwards, as Muon's Newton-Schulz inputs.
                rotate = [i for i in idx if precs[i] is not None]
                shardings = {i: explicit_sharding(mus[i]) for i in rotate}
                rotated = spread_map(
                    _rotate,
                    [
                        (
                            tuple(q is not None for q in q_l[i]),
                            (
                                gathered(mus[i]),
                                *(q for q in q_l[i] if q is not None),
                                *(q for q in bases[i] if q is not None),
                            ),
                        )
                        for i in rotate
                    ],
                    spread,
                    cheap=True,
                )
                for i, m in zip(rotate, rotated):
                    sharding = shardings[i]
                    mus[i] = (
                        m if sharding is None else jax.sharding.reshard(m, sharding)
                    )
                return mus, nus, bases

            def keep(carry):
                return list(carry[0]), list(carry[1]), list(carry[2])

            # Flat: the QRs' results are column-major (see `cond`). The bases are an
            # operand, so that `keep` returns them as they came.
            mus_v, nus_v, bases = every_k(
                t,
                self.precondition_frequency,
                refresh,
                keep,
                (mus, nus, q_l),
                flat=True,
            )
            for i in idx:
                view = views[i]
                mus[i] = write(view.from_view(mus_v[i]), mu_l[i])
                nus[i] = write(view.from_view(nus_v[i]), nu_l[i])
            return updates, mus, nus, precs, bases

        updates, mus, nus, precs, bases = jax.lax.cond(count == 0, first, regular, None)
        # Factor matrices and bases replicated over the params' mesh, as
        # `state_shardings` predicts (XLA would otherwise pick their shardings).
        mesh = mesh_of([g_leaves[i] for i in idx])
        precs, bases = replicate((precs, bases), mesh)
        unflatten = lambda xs: jtu.tree_unflatten(treedef, xs)
        return unflatten(updates), SOAPState(
            increment(count),
            unflatten(mus),
            unflatten(nus),
            unflatten(precs),
            unflatten(bases),
        )


SOAP.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array or a schedule `count -> scalar`
    (evaluated at the number of `update` calls, the first of which makes no step).
    Default `3e-3`.
- `b1`, `b2`: Adam's decay rates $\beta_1, \beta_2$ in `[0, 1)`; default `0.95` each
    (the reference's `betas`).
- `shampoo_beta`: $\beta_s$, the decay of the factor matrices, in `[0, 1]`; `None`
    (default, the reference's `-1`) means `b2`.
- `eps`: Adam's $\epsilon$; default `1e-8`.
- `weight_decay`: $\lambda$, decoupled, multiplied by the learning rate; default
    `0.01`.
- `precondition_frequency`: refresh the eigenbases every this many Adam steps; an
    integer or an integer array (changing an array does not recompile). Default `10`.
- `max_precond_dim`: axes longer than this are not preconditioned; default `10000`.
    (Static.)
- `merge_dims`: merge neighbouring axes while their product is at most
    `max_precond_dim` (e.g. a conv kernel `(out, in, kh, kw)` becomes
    `(out, in*kh*kw)`). (Static.)
- `precondition_1d`: precondition 1-D params with a full `(n, n)` factor (default
    `False`: plain Adam). (Static.)
- `normalize_grads`: divide each param's step direction by its RMS. (Static.)
- `correct_bias`: Adam's bias correction (default `True`). (Static.)
- `precond_dtype`: dtype of the factor matrices and bases; default `state_dtype`,
    else the param's. The reference uses float32: pass `jnp.float32` for float16 or
    bfloat16 params. (Static.)
- `state_dtype`: dtype of the moments; default the param's. An
    [`eqxopt.Quantized`][] quantizes both (in the rotated basis), a dict keyed by
    `"mu"` and `"nu"` each; the factors and bases then default to the param's dtype.
    (Static.)
- `spread`: under `jit` with params on a mesh, how the devices share the per-matrix
    work (eigh, QR and the momentum's rotation): `True` (default) stacks same-shape
    matrices and splits the stacks over every mesh axis (each device computes its
    share, the results are all-gathered); a mesh axis name or a tuple of names uses
    those axes; `False` repeats the work on every device. (Static.)
"""
