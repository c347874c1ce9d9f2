"""L-BFGS-B: limited-memory BFGS for box constraints (Byrd, Lu, Nocedal & Zhu 1995),
with the subspace refinement of Morales & Nocedal (2011)."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Bool, Float, Inexact, Int32, PyTree

from .._bounds import broadcast_bounds, project
from .._checks import check_hyperparams, need_extra, need_params
from .._core.base import scalar_hyperparams
from .._custom_types import Params, Updates
from .._misc import (
    increment,
    is_param,
    tree_map,
    typechecked,
    zero_count,
)
from .linesearch import (
    AbstractLineSearch,
    AbstractLineSearchOptimizer,
    after_search,
    Evaluation,
    scalar_dtype,
    step_updates,
    store_dtype,
)
from .zoom import Zoom


@typechecked
class LBFGSBState(eqx.Module):
    """State of [`eqxopt.LBFGSB`][]; the fields mean what they mean in
    [`eqxopt.LBFGSState`][] (`gamma` is $1/\\theta$, the inverse of L-BFGS-B's
    scaling).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        opt = eqxopt.LBFGSB(memory_size=4)
        state = opt.init({"w": jnp.zeros(3)})
        assert state.s_memory["w"].shape == (4, 3)  # the last 4 steps s_k
        ```
    """

    count: Int32[Array, ""]
    s_memory: PyTree[Inexact[Array, "m ..."]]
    y_memory: PyTree[Inexact[Array, "m ..."]]
    rho_memory: Float[Array, " m"]
    head: Int32[Array, ""]
    gamma: Float[Array, ""]
    linesearch_state: Any
    stalled: Bool[Array, ""]
    failed: Bool[Array, ""]


def _flat(tree, dtype) -> Array:
    """The inexact leaves of `tree`, raveled and concatenated, in `dtype`."""
    leaves = [x for x in jtu.tree_leaves(tree) if is_param(x)]
    return jnp.concatenate([jnp.ravel(x).astype(dtype) for x in leaves])


def _flat_memory(memory, dtype) -> Array:
    """The ring buffers `(m, *shape)` per leaf as one `(m, n)` matrix."""
    leaves = [x for x in jtu.tree_leaves(memory) if is_param(x)]
    return jnp.concatenate(
        [x.reshape(x.shape[0], -1).astype(dtype) for x in leaves], axis=1
    )


def _unflat(vector, like):
    """`vector` split back into the leaves of `like` (shapes; the dtype stays)."""
    leaves, treedef = jtu.tree_flatten(like, is_leaf=lambda x: x is None)
    out, start = [], 0
    for x in leaves:
        if is_param(x):
            out.append(vector[start : start + x.size].reshape(x.shape))
            start += x.size
        else:
            out.append(None)
    return jtu.tree_unflatten(treedef, out)


def _room(x, d, lower, upper):
    """Per variable, how far `x + t d` can go before its bound: `(upper - x) / d`
    where `d > 0`, `(lower - x) / d` where `d < 0`, inf where `d = 0` or that bound is
    infinite. The infinities are selected after the arithmetic, never fed into it:
    reverse mode through the solve would multiply their infinite partials by zero
    cotangents (NaN) wherever a side is open."""
    bound = jnp.where(d > 0, upper, lower)
    ok = (d != 0) & jnp.isfinite(bound)
    ratio = (jnp.where(ok, bound, x) - x) / jnp.where(ok, d, 1)
    return jnp.where(ok, ratio, jnp.inf)


def _compact(s_mat, y_mat, rho, head, theta):
    """The compact representation `B = theta I - W M W^T` (Byrd, Nocedal & Schnabel
    1994) of the L-BFGS matrix: `W = [Y, theta S]` (n x 2m, chronological columns,
    zero for empty slots) and `M` (2m x 2m)."""
    m = rho.shape[0]
    order = (head + jnp.arange(m, dtype=jnp.int32)) % m  # oldest ... newest
    valid = rho[order] != 0
    s = jnp.where(valid[:, None], s_mat[order], 0).T  # (n, m)
    y = jnp.where(valid[:, None], y_mat[order], 0).T
    sy = s.T @ y  # sy[i, j] = s_i . y_j
    d = jnp.diag(sy)
    lower = jnp.tril(sy, -1)
    eye = jnp.eye(m, dtype=s.dtype)
    both = valid[:, None] & valid[None, :]
    top_left = jnp.where(both, -jnp.diag(d), -eye)
    bottom_right = jnp.where(both, theta * (s.T @ s), eye)
    lower = jnp.where(both, lower, 0)
    k = jnp.block([[top_left, lower.T], [lower, bottom_right]])
    w = jnp.concatenate([y, theta * s], axis=1)
    return w, jnp.linalg.inv(k)


def _cauchy(x, g, lower, upper, theta, w, mm):
    """The generalized Cauchy point: the first local minimiser of the quadratic model
    `g^T z + z^T B z / 2` along the projected steepest-descent path `P(x - t g)`
    (Byrd et al. 1995, section 4), found over all path segments at once (cumulative
    sums over the sorted breakpoints). Returns `(x_cauchy, c, t_break, t_star)` with
    `c = W^T (x_cauchy - x)`."""
    dtype = x.dtype
    inf = jnp.asarray(jnp.inf, dtype)
    t = jnp.maximum(_room(x, -g, lower, upper), 0)  # the path is x - t g
    order = jnp.argsort(t)
    ts = t[order]
    gs = g[order]
    ws = w[order]  # (n, 2m)
    n = x.shape[0]
    zero = jnp.zeros((1,), dtype)
    starts = jnp.concatenate([zero, ts])  # segment j: [starts[j], ends[j]]
    ends = jnp.concatenate([ts, inf[None]])
    g2 = gs * gs
    # F_j = sum of g^2 over the variables still moving in segment j (k >= j).
    free_g2 = jnp.concatenate([jnp.cumsum(g2[::-1])[::-1], zero])
    wg = ws * gs[:, None]
    free_wg = jnp.concatenate(
        [jnp.cumsum(wg[::-1], axis=0)[::-1], jnp.zeros((1, w.shape[1]), dtype)]
    )
    # (Only segments with a finite start use it, whose earlier breakpoints are
    # finite: the infinite ones are zeroed, not multiplied, for reverse mode.)
    finite_ts = jnp.where(jnp.isfinite(ts), ts, 0)
    hit_wgt = jnp.concatenate(
        [jnp.zeros((1, w.shape[1]), dtype), jnp.cumsum(wg * finite_ts[:, None], axis=0)]
    )
    finite_start = jnp.isfinite(starts)
    tstart = jnp.where(finite_start, starts, 0)
    p = -free_wg  # W^T d_j
    c = -hit_wgt - tstart[:, None] * free_wg  # W^T (x(t_start) - x)
    p_m = p @ mm
    fp = -free_g2 + theta * tstart * free_g2 - jnp.sum(p_m * c, axis=1)
    fpp = theta * free_g2 - jnp.sum(p_m * p, axis=1)
    length = jnp.where(finite_start, ends - tstart, 0)
    dt = jnp.where(fpp > 0, -fp / jnp.where(fpp > 0, fpp, 1), inf)
    valid = finite_start & ((length > 0) | (jnp.arange(n + 1) == n))
    found = valid & ((fp >= 0) | (dt < length))
    j = jnp.argmax(found)
    t_star = jnp.where(
        jnp.any(found),
        tstart[j] + jnp.where(fp[j] >= 0, 0, jnp.maximum(dt[j], 0)),
        jnp.max(jnp.where(finite_start, tstart, 0)),
    )
    # A variable whose breakpoint the path reaches sits at its bound: the bound
    # itself, selected (as SciPy's `cauchy` sets it), not `x - t g` computed, whose
    # derivatives (through `t` and, at tied breakpoints, `t_star`) cancel only in
    # exact arithmetic: with two tied breakpoints, reverse mode through the solve
    # gave a nonzero derivative of a variable pinned at its bound.
    reached = jnp.isfinite(t) & (t <= t_star)
    x_cauchy = jnp.where(reached, jnp.where(g < 0, upper, lower), x - t_star * g)
    x_cauchy = jnp.clip(x_cauchy, lower, upper)
    return x_cauchy, w.T @ (x_cauchy - x), t, t_star


def _subspace(x, g, lower, upper, x_cauchy, c, free, theta, w, mm):
    """The subspace step (the direct primal method of Byrd et al. 1995, section 5.1,
    with Morales & Nocedal's 2011 projection): minimise the model over the free
    variables from the Cauchy point, project the minimiser onto the box, and keep the
    projection if it is a descent direction from `x`, else truncate the step to the
    box (the 1995 algorithm)."""
    dtype = x.dtype
    fw = jnp.where(free[:, None], w, 0)
    r = jnp.where(free, g + theta * (x_cauchy - x) - w @ (mm @ c), 0)
    v = mm @ (fw.T @ r)
    n_mat = jnp.eye(mm.shape[0], dtype=dtype) - (mm @ (fw.T @ fw)) / theta
    v = jnp.linalg.solve(n_mat, v)
    du = jnp.where(free, -r / theta - (fw @ v) / theta**2, 0)
    projected = jnp.clip(x_cauchy + du, lower, upper)
    descent = jnp.sum((projected - x) * g) < 0
    # The 1995 truncation: the largest alpha <= 1 keeping x_cauchy + alpha du feasible.
    room = _room(x_cauchy, du, lower, upper)
    alpha = jnp.clip(jnp.min(jnp.where(free, room, jnp.inf), initial=1.0), 0, 1)
    truncated = jnp.clip(x_cauchy + alpha * du, lower, upper)
    return jnp.where(descent, projected, truncated)


def _max_feasible_step(x, d, lower, upper):
    """The largest `t` with `lower <= x + t d <= upper` (inf when unbounded)."""
    room = _room(x, d, lower, upper)
    room = jnp.where(jnp.isnan(room), jnp.inf, jnp.maximum(room, 0))
    return jnp.min(room, initial=jnp.inf)


class LBFGSB(AbstractLineSearchOptimizer[LBFGSBState]):
    r"""L-BFGS-B: limited-memory BFGS for box constraints $\ell \le x \le u$.

    Each update builds the L-BFGS model $m(z) = g^\top z + \tfrac12 z^\top B z$ in its
    compact form $B = \theta I - W M W^\top$ from the last `memory_size` pairs, and

    1. finds the generalized Cauchy point $x^c$, the first local minimiser of $m$
       along the projected steepest-descent path $P(x - t g)$;
    2. minimises $m$ over the variables that are free at $x^c$ (the others stay at
       their bounds), projects the minimiser $\hat x$ onto the box, and keeps
       $\bar x = P(\hat x)$ if $\bar x - x$ is a descent direction, else truncates the
       step from $x^c$ towards $\hat x$ at the box (Morales & Nocedal 2011, as SciPy's
       `L-BFGS-B` 3.0);
    3. searches along $d = \bar x - x$ for a step $t$ satisfying the strong Wolfe
       conditions, with $t$ at most the end of the feasible segment (SciPy's choices:
       the first step has unit length unless every variable is bounded on both sides,
       and is at most 1 when any bound is finite).

    Without finite bounds the Cauchy point and subspace step reduce to the L-BFGS
    direction $-H g$: it takes the same steps as [`eqxopt.LBFGS`][] (up to rounding).
    The variables are handled as one flat vector inside an update (the Cauchy point
    sorts all breakpoints); the memory is kept per param leaf in the params' dtype.

    `update(grads, state, params, *, value, value_fn, bounds)` needs the loss `value`
    at `params`, `value_fn: params -> loss` and `bounds=(lower, upper)` (PyTree
    prefixes of the params; a scalar bounds every element; `None` or $\pm\infty$
    leaves a side open); [`eqxopt.minimize`][] passes them, with
    `minimize(..., bounds=...)` (without `bounds=`, both sides open). The line search
    evaluates `value_fn` at the projection of each trial point, so no evaluation is
    ever outside the box.

    ??? cite "References"

        ```bibtex
        @article{byrd1995limited,
            title={A Limited Memory Algorithm for Bound Constrained Optimization},
            author={Byrd, Richard H. and Lu, Peihuang and Nocedal, Jorge and
                    Zhu, Ciyou},
            journal={SIAM Journal on Scientific Computing},
            volume={16}, number={5}, pages={1190--1208}, year={1995}}

        @article{morales2011remark,
            title={Remark on ``Algorithm 778: L-BFGS-B: Fortran Subroutines for
                   Large-Scale Bound Constrained Optimization''},
            author={Morales, Jos{\'e} Luis and Nocedal, Jorge},
            journal={ACM Transactions on Mathematical Software},
            volume={38}, number={1}, pages={7:1--7:4}, year={2011}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        def loss(y, args):
            return jnp.sum((y - jnp.array([-1.0, 0.5, 3.0])) ** 2)


        sol = eqxopt.minimize(loss, eqxopt.LBFGSB(), jnp.zeros(3), bounds=(0.0, 1.0))
        assert jnp.allclose(sol.value, jnp.array([0.0, 0.5, 1.0]))
        ```
    """

    memory_size: int = eqx.field(default=10, static=True)
    linesearch: AbstractLineSearch | None = None

    bounds_aware = True

    def __check_init__(self):
        check_hyperparams(self, positive_int=("memory_size",))
        if self.linesearch is not None and not isinstance(
            self.linesearch, AbstractLineSearch
        ):
            raise ValueError(
                "`LBFGSB(linesearch=...)` must be an eqxopt line search "
                "(`eqxopt.Zoom()`, `eqxopt.Backtracking()`) or None, got "
                f"{type(self.linesearch).__name__}."
            )

    @property
    def _search(self) -> AbstractLineSearch:
        return Zoom() if self.linesearch is None else self.linesearch

    def init(self, params: Params) -> LBFGSBState:
        m = self.memory_size
        dtype = store_dtype(params)
        return LBFGSBState(
            count=zero_count(),
            s_memory=tree_map(lambda p: jnp.zeros((m,) + p.shape, p.dtype), params),
            y_memory=tree_map(lambda p: jnp.zeros((m,) + p.shape, p.dtype), params),
            rho_memory=jnp.zeros((m,), dtype),
            head=zero_count(),
            gamma=jnp.zeros((), dtype),
            linesearch_state=self._search.init(params),
            stalled=jnp.zeros((), bool),
            failed=jnp.zeros((), bool),
        )

    def update(
        self,
        grads: Updates,
        state: LBFGSBState,
        params: Params | None = None,
        **extra,
    ) -> tuple[Updates, LBFGSBState]:
        need_params(self, params)
        value, value_fn, bounds = need_extra(self, extra, "value", "value_fn", "bounds")
        lower_tree, upper_tree = broadcast_bounds(bounds, params, what="LBFGSB bounds")
        dtype = scalar_dtype(params)
        x = _flat(params, dtype)
        g = _flat(grads, dtype)
        lower = _flat(lower_tree, dtype)
        upper = _flat(upper_tree, dtype)
        gamma = state.gamma.astype(dtype)
        # theta = 1 until a curvature pair has been kept (as SciPy's initial theta).
        empty = gamma <= 0
        theta = jnp.where(empty, 1, 1 / jnp.where(empty, 1, gamma))
        # SciPy's first-step rules (`lnsrlb` in lbfgsb.c) hold on the first iteration
        # only (`iter == 0`), not whenever the memory is empty: with every curvature
        # pair skipped, they would cap each step at unit length.
        first = state.count == 0
        w, mm = _compact(
            _flat_memory(state.s_memory, dtype),
            _flat_memory(state.y_memory, dtype),
            state.rho_memory.astype(dtype),
            state.head,
            theta,
        )
        x_cauchy, c, t_break, t_star = _cauchy(x, g, lower, upper, theta, w, mm)
        free = (t_break > t_star) & (lower < upper)
        x_bar = _subspace(x, g, lower, upper, x_cauchy, c, free, theta, w, mm)
        d = x_bar - x
        constrained = jnp.any(jnp.isfinite(lower) | jnp.isfinite(upper))
        boxed = jnp.all(jnp.isfinite(lower) & jnp.isfinite(upper))
        t_max = jnp.where(
            constrained & first, 1, _max_feasible_step(x, d, lower, upper)
        )
        # SciPy's first trial step: 1 / |d| on the first iteration (unless boxed),
        # else 1; the direction is scaled so that the search starts at t = 1.
        # (|d| through a safe square root: at d = 0, as in a lane of a `vmap` that
        # has converged, sqrt's infinite slope would give reverse mode 0 * inf.)
        squared = jnp.sum(d * d)
        moved = squared > 0
        norm = jnp.sqrt(jnp.where(moved, squared, 1))
        scale = jnp.where(first & ~boxed & moved, jnp.minimum(1 / norm, t_max), 1)
        scale = jnp.where(scale > 0, scale, 1)
        direction = _unflat(scale * d, params)
        direction = tree_map(lambda u: u.astype(dtype), direction)
        # (inf without a bound in the way: selected, not divided, for reverse mode.)
        bounded = jnp.isfinite(t_max)
        max_step = jnp.where(bounded, jnp.where(bounded, t_max, 1) / scale, jnp.inf)

        value_and_grad = eqx.filter_value_and_grad(value_fn)

        def projected_value_and_grad(p):
            return value_and_grad(project(p, lower_tree, upper_tree))

        step, ls_state = self._search.search(
            projected_value_and_grad,
            params,
            direction,
            jnp.asarray(value),
            grads,
            state.linesearch_state,
            max_step=max_step,
        )
        updates = step_updates(step, direction, params)
        new_params = eqx.apply_updates(params, updates)
        new_params = project(new_params, lower_tree, upper_tree)
        memory = (
            state.s_memory,
            state.y_memory,
            state.rho_memory,
            state.head,
            state.gamma,
        )
        (s_mem, y_mem, rho, head, new_gamma), stalled, failed = after_search(
            state, memory, new_params, params, grads, direction, ls_state, dtype
        )
        new_state = LBFGSBState(
            count=increment(state.count),
            s_memory=s_mem,
            y_memory=y_mem,
            rho_memory=rho,
            head=head,
            gamma=new_gamma,
            linesearch_state=ls_state,
            stalled=stalled,
            failed=failed,
        )
        return updates, new_state

    def hyperparams(self, state: LBFGSBState) -> dict[str, Any]:
        out = scalar_hyperparams(self, state.count)
        out["linesearch"] = self._search.hyperparams(state.linesearch_state)
        return out

    def last_evaluation(self, state: LBFGSBState) -> Evaluation:
        """The loss and gradient the line search evaluated at the (projected) params
        after the last update."""
        ls = state.linesearch_state
        return Evaluation(ls.value, ls.grad, state.failed, ls.num_evals, state.stalled)


LBFGSB.__init__.__doc__ = r"""**Arguments:**

- `memory_size`: the number $m \ge 1$ of pairs kept. (Static.)
- `linesearch`: `None` (default) for [`eqxopt.Zoom`][] with its defaults (strong
    Wolfe conditions) along the feasible segment, or an [`eqxopt.Zoom`][] /
    [`eqxopt.Backtracking`][] to use instead.
"""
