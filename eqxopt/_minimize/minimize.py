"""`minimize`: drive any eqxopt optimizer to a minimum of a deterministic loss."""

import dataclasses
import functools as ft
import typing
from collections.abc import Callable
from typing import Any, NamedTuple, no_type_check

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
import numpy as np
from jaxtyping import Array, Bool, Int32, PyTree

from .._bounds import (
    broadcast_bounds,
    check_bounds,
    project,
    project_leaf,
)
from .._core.base import AbstractOptimizer
from .._misc import (
    compute_dtype,
    is_param,
    real_dtype,
    strong,
    tree_map,
)
from .constrained import AugmentedLagrangian, Constraints
from .lbfgsb import LBFGSB
from .linesearch import (
    AbstractLineSearchOptimizer,
    cast,
    conj,
    ProjectedLoss,
    select,
)
from .loop import loops
from .solution import error_if_failed, RESULTS, Solution
from .solve import (
    ADJOINTS,
    Carry,
    check_options,
    check_solver,
    jit_solve,
    result_of,
    run_loop,
)


_ADJOINTS = ("unrolled", "implicit")


def _split(fn, has_aux):
    def loss_and_aux(y, args):
        out = fn(y, args)
        if has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise ValueError(
                    "eqxopt.minimize: with `has_aux=True`, `fn` must return a pair "
                    "`(loss, aux)`."
                )
            loss, aux = out
            for path, leaf in jtu.tree_flatten_with_path(aux)[0]:
                if not eqx.is_array_like(leaf):
                    raise ValueError(
                        "eqxopt.minimize: `aux` (the second element of `fn`'s output) "
                        "is carried through the solve's loop, so it must be a PyTree "
                        f"of arrays; `aux{jtu.keystr(path)}` is a "
                        f"{type(leaf).__name__}."
                    )
        elif isinstance(out, (tuple, list)):
            raise ValueError(
                f"eqxopt.minimize: `fn` returned a {type(out).__name__} of "
                f"{len(out)} elements, not a scalar loss. If it returns `(loss, aux)`, "
                "pass `has_aux=True`."
            )
        else:
            loss, aux = out, None
        if not eqx.is_array_like(loss):
            raise ValueError(
                "eqxopt.minimize: `fn` must return a real floating-point scalar loss"
                + (" (as the first element of its output)" if has_aux else "")
                + f", got a {type(loss).__name__}."
            )
        loss = jnp.asarray(loss)
        if loss.shape != () or not jnp.issubdtype(loss.dtype, jnp.floating):
            raise ValueError(
                "eqxopt.minimize: `fn` must return a real floating-point scalar loss"
                + (" (as the first element of its output)" if has_aux else "")
                + f", got an array of shape {loss.shape} and dtype {loss.dtype}."
            )
        return strong(loss), aux

    return loss_and_aux


def _max_abs(tree, dtype):
    """`max |x|` over the leaves (0 if none), in `dtype`: `jnp.max(jnp.abs(x))`'s
    primitives, bound directly (trace time)."""
    out = np.zeros((), dtype)
    for x in jtu.tree_leaves(tree):
        if is_param(x) and x.size > 0:
            size = lax.reduce_max(lax.abs(x), tuple(range(x.ndim)))
            out = lax.max(out, cast(size, dtype))
    return jnp.asarray(out)


def _all_finite(tree):
    out = jnp.ones((), bool)
    for x in jtu.tree_leaves(tree):
        if is_param(x):
            out = out & jnp.all(jnp.isfinite(x))
    return out


class _Options(NamedTuple):
    """The static options of a solve (part of the compilation key; a tuple: built on
    every call, it costs a fraction of a Module's construction). `differentiable`:
    whether reverse mode may differentiate the solve's loops (see `loop.py`). An inner
    solve of the augmented Lagrangian has a traced `atol`."""

    max_steps: int
    rtol: float
    atol: float | Array
    has_aux: bool
    progress: bool
    differentiable: bool = True


# A line search accepts a step without decrease only where rounding in the loss
# decides (its approximate Wolfe condition); on a badly conditioned quadratic such
# steps come alone or in pairs, mixed with decreasing ones. This many in a row means
# that the loss can no longer resolve the decrease the model predicts. Without a line
# search, as many steps in a row at a fixed point (`_at_fixed_point`) stop the solve:
# a step counter can still change what a step does (SOAP makes no update on its first
# step, then moves).
_MAX_NO_DECREASE = 5


class _Loss(eqx.Module):
    """`fn` with the static part of `y` and `args`: `y -> fn(combine(y), args)`."""

    fn: Callable
    y_static: PyTree
    args: PyTree


def _loss_impl(static, dynamic, y):
    treedef, leaves, has_aux = static
    loss: _Loss = eqx.combine(dynamic, jtu.tree_unflatten(treedef, leaves))
    # `fn` is differentiated: any loop of ours inside it must be differentiable.
    with loops(differentiable=True):
        return _split(loss.fn, has_aux)(eqx.combine(y, loss.y_static), loss.args)


_loss_jit = jax.jit(_loss_impl, static_argnums=0)


class _Problem(eqx.Module):
    """Everything a step needs, the traced parts included: the loss, the optimizer,
    the static part of `y`, `args` and the bounds (full trees, or `None`)."""

    fn: Callable
    optimizer: AbstractOptimizer
    y_static: PyTree
    args: PyTree
    bounds: tuple[PyTree, PyTree] | None

    @property
    def bound_aware(self) -> bool:
        """Whether the optimizer takes the bounds into its model (else each step is
        projected onto the box)."""
        return self.optimizer.bounds_aware

    def loss_and_aux(self, y, has_aux):
        """`(loss, aux)` at `y`. Through one cached `jax.jit` of `fn`, so that `fn` is
        traced once per solve: the evaluation at `y0`, the line search's and the
        implicit adjoint's all reuse that trace (and its derivatives)."""
        loss = _Loss(self.fn, self.y_static, self.args)
        dynamic, static = eqx.partition(loss, eqx.is_array)
        leaves, treedef = jtu.tree_flatten(static)
        return _loss_jit((treedef, tuple(leaves), has_aux), dynamic, y)

    def value_and_grad(self, y, has_aux):
        """`((loss, aux), grad)` at `y`, the gradient in the updates' convention."""
        (f, aux), g = eqx.filter_value_and_grad(
            lambda y: self.loss_and_aux(y, has_aux), has_aux=True
        )(y)
        return (f, aux), conj(g)

    def value_fn(self, has_aux):
        """The loss as the optimizer sees it: with bounds and an optimizer that does
        not know them, the loss of the projected point (so a line search never
        evaluates outside the box)."""
        loss = lambda y: self.loss_and_aux(y, has_aux)[0]
        if self.bounds is None or self.bound_aware:
            return loss
        return ProjectedLoss(loss, *self.bounds)


def _step(problem: _Problem, options: _Options, carry: Carry) -> Carry:
    """One optimizer step of the solve (the body of its loop)."""
    optimizer, has_aux = problem.optimizer, options.has_aux
    value_fn = problem.value_fn(has_aux)
    extra: dict[str, Any] = dict(
        value=carry.f,
        grad=conj(carry.g),
        value_fn=value_fn,
        # Optax's names, for the optimizers that evaluate the loss themselves (SAM's
        # adversarial steps, Sophia's Hessian estimate); traced only where used.
        obj_fn=value_fn,
        grad_fn=lambda y, i: conj(eqx.filter_grad(value_fn)(y)),
    )
    if problem.bound_aware:  # (without bounds: both sides open, LBFGS's steps)
        extra["bounds"] = (None, None) if problem.bounds is None else problem.bounds
    updates, state = optimizer.update(carry.g, carry.state, carry.y, **extra)
    y = eqx.apply_updates(carry.y, updates)
    if problem.bounds is not None:
        y = project(y, *problem.bounds)
    evaluation = _cached(problem)
    evaluation = None if evaluation is None else evaluation(state)
    if evaluation is None:
        (f, aux), g = problem.value_and_grad(y, has_aux)
        num_fevals = carry.num_fevals + 1
    else:
        f = evaluation.value.astype(carry.f.dtype)
        g = jtu.tree_map(
            lambda new, old: None if old is None else new.astype(old.dtype),
            evaluation.grad,
            carry.g,
            is_leaf=lambda x: x is None,
        )
        aux = carry.aux
        num_fevals = carry.num_fevals + evaluation.num_evals
    no_decrease = carry.no_decrease
    assert no_decrease is not None  # (a `minimize` carry)
    if evaluation is None or not (problem.bounds is None or problem.bound_aware):
        # A first-order step, or a projected method's: it stops at a fixed point.
        # (Along a path bent by the projection, a line search may accept steps
        # without decrease and still reach the solution through them: Rosenbrock 10
        # in [-2, 0.5] with `LBFGS()`, 547 steps to atol=1e-6, where the rule below
        # would stop after 48, at a loss 1.4e-6 higher.)
        failed = jnp.zeros((), bool)
        fixed = _at_fixed_point(optimizer, (y, state), (carry.y, carry.state))
        no_decrease = select(fixed, no_decrease + 1, 0)
        stalled = no_decrease >= _MAX_NO_DECREASE
    elif optimizer.rejects_steps:
        # A rejected trial step leaves `y` and shrinks the trust region: not a step
        # without decrease; the optimizer says when it can no longer move `y`.
        failed = evaluation.failed
        stalled = evaluation.stalled
    else:
        failed = evaluation.failed
        # The optimizer says when its line search failed below the resolution of y;
        # else accepted steps that no longer decrease the loss are counted.
        same = ~failed & ~(f < carry.f)
        no_decrease = select(same, no_decrease + 1, 0)
        stalled = evaluation.stalled | (no_decrease >= _MAX_NO_DECREASE)
    num_steps = select(failed, carry.num_steps, carry.num_steps + 1)
    converged, finite = _check(f, g, y, problem.bounds, options)
    return Carry(
        y=y,
        f=f,
        g=g,
        aux=aux,
        state=state,
        num_steps=num_steps,
        num_fevals=num_fevals,
        converged=converged,
        finite=finite,
        stalled=stalled,
        failed=failed,
        no_decrease=no_decrease,
    )


def _cached(problem: _Problem):
    """The optimizer's `last_evaluation`, the loss and gradient at the new point, for
    an optimizer with a line search. For a projected method too: its line search
    evaluates `fn` and its gradient at the projection of each trial point (see
    `ProjectedLoss`), and the new point is the projection of the accepted one."""
    optimizer = problem.optimizer
    if not optimizer.evaluates_loss:
        return None
    return typing.cast(AbstractLineSearchOptimizer, optimizer).last_evaluation


def _at_fixed_point(optimizer: AbstractOptimizer, new, old) -> Bool[Array, ""]:
    """Whether a first-order step (no line search) left `y`, the floating-point
    leaves of the optimizer's state and its hyperparameters (schedules at the step
    count) exactly as they were: every later step would then repeat it, so the point
    can no longer move, unless a step counter changes what the step does.
    (`new`, `old`: `(y, state)` after and before the step.)

    A step that leaves `y` alone is not enough: a first-order step may move it again
    later (momentum changing sign: runs of up to 10 unchanged steps; Adam(0.1) in
    float16: 464, on (y - 2)^2, measured), as may a schedule (a warmup from 0).
    Counters are left out (they change on every step); what they do inside an update
    where no hyperparameter shows it (SOAP's first step, which makes no update;
    Adam's bias corrections) is why the solve stops only after several such steps in
    a row."""
    (y, state), (y_old, state_old) = new, old
    changed = jnp.zeros((), bool)
    for a, b in zip(
        _leaves((y, state, optimizer.hyperparams(state))),
        _leaves((y_old, state_old, optimizer.hyperparams(state_old))),
    ):
        changed = changed | jnp.any(a != b)
    return ~changed


def _gradient_measure(g, y, bounds):
    """The gradient whose size decides convergence: `g`, or with bounds the projected
    gradient `P(y - g) - y` (L-BFGS-B's test)."""
    if bounds is None:
        return g
    lower, upper = bounds
    return tree_map(
        lambda g, y, lo, up: project_leaf(y - g.astype(y.dtype), lo, up) - y,
        g,
        y,
        lower,
        upper,
        names=("grad", "y", "lower", "upper"),
    )


def _tolerance(tol, dtype):
    """A tolerance in `dtype`: a constant for a Python number, else (an inner solve's
    tolerance, traced) a cast."""
    if isinstance(tol, (int, float)):
        return np.asarray(tol, dtype)
    return cast(tol, dtype)


def _check(f, g, y, bounds, options):
    """`(converged, finite)` at `y`: `max|g| <= atol + rtol |f|` (`g` projected with
    bounds), in at least float32, and whether `f` and every entry of `g` are finite.

    Each reduction over a leaf costs compilation time (XLA's CPU code for a reduction
    is much larger than for an elementwise operation), so without bounds and for real
    leaves `finite` comes from the same maximum: `max|g|` is NaN or infinite exactly
    when some entry of `g` is (the maximum propagates NaN)."""
    measure = _gradient_measure(g, y, bounds)
    dtype = compute_dtype(f.dtype, *(real_dtype(x.dtype) for x in _leaves(measure)))
    atol, rtol = _tolerance(options.atol, dtype), _tolerance(options.rtol, dtype)
    tol = lax.add(atol, lax.mul(rtol, cast(lax.abs(f), dtype)))
    size = _max_abs(measure, dtype)
    converged = lax.le(size, tol)
    if bounds is None and not any(jnp.iscomplexobj(x) for x in _leaves(g)):
        finite = lax.is_finite(f) & lax.is_finite(size)
    else:  # the projection may clip an infinite entry; |complex| may overflow
        finite = jnp.isfinite(f) & _all_finite(g)
    return converged, finite


# `optx.internal.implicit_jvp` wants plain global functions: `no_type_check` keeps a
# runtime type checker (jaxtyping's import hook) from wrapping these two.
@no_type_check
def _primal(inputs):
    """The solve: `inputs -> (y, residual)`. A global function (implicit_jvp needs
    one); everything it uses comes in through `inputs`."""
    y, residual, _ = _run(*inputs)
    return y, residual


def _run(problem: _Problem, y0, options: _Options, state0=None, start=None):
    """The solve's loop: `(y, (loss, aux, state, result, stats), grad)`. `state0`:
    the optimizer's state to start from (else `init(y0)`); `start`: the loss and
    gradient at `y0` when known (no aux), which are then not evaluated (and not
    counted)."""
    if start is None:
        (f0, aux0), g0 = problem.value_and_grad(y0, options.has_aux)
    else:
        (f0, g0), aux0 = start, None
    if state0 is None:
        state0 = problem.optimizer.init(y0)
    cached = _cached(problem)
    uses_cache = cached is not None and cached(state0) is not None
    converged0, finite0 = _check(f0, g0, y0, problem.bounds, options)
    carry = Carry.start(
        y0,
        f0,
        g0,
        aux0,
        state0,
        converged=converged0,
        finite=finite0,
        no_decrease=jnp.zeros((), jnp.int32),
    )
    if start is not None:
        carry = dataclasses.replace(carry, num_fevals=jnp.zeros((), jnp.int32))
    carry, history = run_loop(
        ft.partial(_step, problem, options),
        carry,
        max_steps=options.max_steps,
        differentiable=options.differentiable,
        progress="minimize" if options.progress else None,
        # A failed line search returns a zero step: that step is not applied.
        record=lambda old, new: select(new.failed, jnp.nan, old.f),
    )
    if options.has_aux and uses_cache:
        # The line search returns the loss and gradient at the new point, not `aux`.
        f, aux = problem.loss_and_aux(carry.y, options.has_aux)
        converged, finite = _check(f, carry.g, carry.y, problem.bounds, options)
        carry = dataclasses.replace(
            carry,
            f=f,
            aux=aux,
            num_fevals=carry.num_fevals + 1,
            converged=converged,
            finite=finite,
        )
    stats = {
        "num_steps": carry.num_steps,
        "num_fevals": carry.num_fevals,
        "history": history,
    }
    for name in problem.optimizer.state_stats:
        stats[name] = getattr(carry.state, name)
    return carry.y, (carry.f, carry.aux, carry.state, carry.result, stats), carry.g


@no_type_check
def _rewrite(y, residual, inputs):
    """The optimality condition, for the implicit adjoint: `grad fn(y, args) = 0`, or
    with bounds `y - P(y - grad) = 0` (so only the free variables move with `args`:
    the rows of active variables are the identity)."""
    problem, _, options = inputs
    grad = eqx.filter_grad(lambda y: problem.loss_and_aux(y, options.has_aux)[0])(y)
    if problem.bounds is None:
        return grad
    return _gradient_measure(conj(grad), y, problem.bounds)


def _leaves(tree):
    return [x for x in jtu.tree_leaves(tree) if is_param(x)]


def _start(y0, bounds, throw_inside):
    """`(y_dyn, y_static, bounds)`: `y0` split into the leaves that are optimized
    (strongly typed) and the rest, the bounds broadcast to `y_dyn` (checked inside the
    computation when they are traced) and `y_dyn` projected into the box."""
    y_dyn, y_static = eqx.partition(y0, is_param)
    y_dyn = jtu.tree_map(strong, y_dyn)
    if bounds is not None:
        bounds = broadcast_bounds(bounds, y_dyn)
        if throw_inside:
            # Traced bounds (under `vmap`, `jit`) are checked at run time, naming the
            # first leaf with an empty box or a NaN bound: concrete ones raised a
            # `ValueError` before the solve.
            paths = [
                jtu.keystr(path) or "the params"
                for path, x in jtu.tree_flatten_with_path(y_dyn)[0]
                if is_param(x)
            ]
            pairs = list(zip(*map(_leaves, bounds)))
            bad = jnp.stack(
                [jnp.any(lo > up) for lo, up in pairs]
                + [jnp.any(jnp.isnan(lo) | jnp.isnan(up)) for lo, up in pairs]
            )
            y_dyn = eqx.branched_error_if(
                y_dyn,
                jnp.any(bad),
                jnp.argmax(bad),
                [
                    f"eqxopt.minimize: `bounds`: lower > upper at {p} (a box needs "
                    "lower <= upper)."
                    for p in paths
                ]
                + [
                    f"eqxopt.minimize: `bounds`: a NaN bound at {p} (an open side is "
                    "None or +-inf)."
                    for p in paths
                ],
            )
        y_dyn = project(y_dyn, *bounds)
    return y_dyn, y_static, bounds


def _solve(fn, optimizer, y0, args, bounds, options, throw_inside, adjoint):
    """A solve of `minimize` without constraints (inside `jit_solve`'s `jit`)."""
    y_dyn, y_static, bounds = _start(y0, bounds, throw_inside)
    problem = _Problem(fn, optimizer, y_static, args, bounds)
    tags = frozenset() if bounds is not None else frozenset({lx.symmetric_tag})
    y, (loss, aux, state, result, stats) = adjoint.solve(
        _primal, _rewrite, (problem, y_dyn, options), tags
    )
    if not adjoint.through_loop:
        # Recompute the loss and aux outside the custom derivative, so that they are
        # differentiable too (through `y` and `args`).
        loss, aux = problem.loss_and_aux(y, options.has_aux)
        stats = dict(stats, num_fevals=stats["num_fevals"] + 1)
    out = (loss, aux, state, result, stats)
    return _solution(eqx.combine(y, y_static), out, throw_inside)


def _solve_constrained(
    fn, constrained, y0, args, bounds, options, throw_inside, adjoint
):
    """A solve of `minimize` with constraints (inside `jit_solve`'s `jit`)."""
    y_dyn, y_static, bounds = _start(y0, bounds, throw_inside)
    inputs = (fn, constrained, y_dyn, y_static, args, bounds, options)
    root, (loss, aux, state, result, stats) = adjoint.solve(
        _constrained_primal, _kkt, inputs, frozenset()
    )
    y, eq, ineq = root
    refs = _constraint_refs(constrained.constraints, y_dyn, y_static, args)
    multipliers = {"eq": _unflat(eq, refs[0]), "ineq": _unflat(ineq, refs[1])}
    out = (loss, aux, state, result, stats)
    return _solution(eqx.combine(y, y_static), out, throw_inside, multipliers)


def _solution(value, out, throw_inside, multipliers=None) -> Solution:
    """The `Solution` at `value` from the solve's outputs `out = (loss, aux, state,
    result, stats)`, raising inside the computation when it failed (`throw_inside`)."""
    loss, aux, state, result, stats = out
    sol = Solution(value, loss, aux, state, result, stats, multipliers=multipliers)
    if throw_inside:
        sol = error_if_failed(sol, result, "eqxopt.minimize")
    return sol


class _Constrained(eqx.Module):
    """`minimize(optimizer=method, constraints=constraints)`, as one input."""

    method: AugmentedLagrangian
    constraints: Constraints


def _constraint_values(con, y, args, name, dtype):
    """`(values as one vector in dtype, structure)` of a constraint function's
    output at `y` (`structure`: treedef, shapes and dtypes, or `None` for no
    constraint). Checked at trace time: a PyTree of real floating-point arrays."""
    if con is None:
        return jnp.zeros((0,), dtype), None
    out = con(y, args)
    leaves = []
    for path, leaf in jtu.tree_flatten_with_path(out)[0]:
        where = f"`constraints.{name}(y, args){jtu.keystr(path)}`"
        if not eqx.is_array_like(leaf) or isinstance(leaf, bool):
            raise ValueError(
                f"eqxopt.minimize: {where} must be a real floating-point array (the "
                f"constraint returns a PyTree of arrays), got a {type(leaf).__name__}."
            )
        leaf = jnp.asarray(leaf)
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            raise ValueError(
                f"eqxopt.minimize: {where} must be a real floating-point array, got "
                f"dtype {leaf.dtype}."
            )
        leaves.append(leaf)
    treedef = jtu.tree_structure(out)
    structure = (treedef, tuple((x.shape, x.dtype) for x in leaves))
    flat = [lax.convert_element_type(jnp.ravel(x), dtype) for x in leaves]
    vector = jnp.concatenate(flat) if flat else jnp.zeros((0,), dtype)
    return vector, structure


def _constraint_refs(constraints, y_dyn, y_static, args):
    """The output structures of the two constraint functions (traced abstractly)."""
    y = eqx.combine(y_dyn, y_static)
    out = []
    for name in ("eq", "ineq"):
        con = getattr(constraints, name)
        if con is None:
            out.append(None)
        else:
            shape = jax.eval_shape(lambda y, a: con(y, a), y, args)  # noqa: B023
            leaves, treedef = jtu.tree_flatten(shape)
            out.append((treedef, tuple((x.shape, x.dtype) for x in leaves)))
    return out


def _unflat(vector, structure):
    if structure is None:
        return None
    treedef, shapes = structure
    leaves, start = [], 0
    for shape, dtype in shapes:
        size = int(np.prod(shape))
        leaves.append(vector[start : start + size].reshape(shape).astype(dtype))
        start += size
    return jtu.tree_unflatten(treedef, leaves)


class _AugmentedLoss(eqx.Module):
    """The augmented Lagrangian as a loss for the inner solve: `(y, (args, lam, mu,
    rho)) -> (L, (f, aux, eq, ineq))`. `refs`: the constraints' output structures at
    `y0` (static: a call that returns another structure raises)."""

    fn: Callable
    constraints: Constraints
    has_aux: bool = eqx.field(static=True)
    refs: Any = eqx.field(static=True)

    def evaluate(self, y, args):
        f, aux = _split(self.fn, self.has_aux)(y, args)
        h, c = self.values(y, args, f.dtype)
        return f, aux, h, c

    def values(self, y, args, dtype):
        """The constraints alone at `y`: `(eq, ineq)`, each one vector in `dtype`."""
        values = []
        refs = (None, None) if self.refs is None else self.refs
        for name, ref in zip(("eq", "ineq"), refs):
            con = getattr(self.constraints, name)
            vector, structure = _constraint_values(con, y, args, name, dtype)
            if self.refs is not None and structure != ref:
                raise ValueError(
                    f"eqxopt.minimize: `constraints.{name}` returned outputs of "
                    f"different structures or shapes across calls: {structure} here, "
                    f"{ref} at `y0`. A constraint must return arrays of fixed shapes."
                )
            values.append(vector)
        return values[0], values[1]

    def __call__(self, y, args):
        args, lam, mu, rho = args
        f, _, h, c = self.evaluate(y, args)
        return _phr(f, h, c, lam, mu, rho)[0]


def _phr(f, h, c, lam, mu, rho):
    """`(L, dL/dh, dL/dc)`: the PHR function less its constant, `f - lam.h + rho/2
    |h|^2 + rho/2 sum(max(0, mu/rho - c)^2 - (mu/rho)^2)` (it equals `f` where `h =
    0` and `mu c = 0`), and its partial derivatives in `h` and `c`."""
    shifted = jnp.maximum(mu / rho - c, 0)
    penalty = (rho / 2) * (
        jnp.sum(jnp.square(h - lam / rho) - jnp.square(lam / rho))
        + jnp.sum(jnp.square(shifted) - jnp.square(mu / rho))
    )
    return f + penalty, rho * h - lam, -rho * shifted


def _inf_norm(x):
    return jnp.max(jnp.abs(x), initial=0)


def _violation(h, c):
    """`max(|eq|_inf, max(-ineq, 0))`."""
    return jnp.maximum(_inf_norm(h), jnp.max(-c, initial=0))


# Conn, Gould & Toint's (1991) cap on the factor by which each success shrinks the
# inner tolerance (LANCELOT's value).
_GAMMA_1 = 0.1


class _Outer(eqx.Module):
    """The carry of the augmented Lagrangian's outer loop (`num_steps`: outer
    iterations)."""

    num_steps: Int32[Array, ""]
    y: PyTree
    lam: Array
    mu: Array
    rho: Array
    tol: Array
    omega: Array
    eta: Array
    prev_measure: Array
    prev_violation: Array
    f: Array
    aux: Any
    h: Array
    c: Array
    L: Array
    g: PyTree
    state: Any
    num_fevals: Int32[Array, ""]
    num_cevals: Int32[Array, ""]
    converged: Bool[Array, ""]
    finite: Bool[Array, ""]
    infeasible: Bool[Array, ""]
    stuck: Bool[Array, ""]

    @property
    def stop(self) -> Bool[Array, ""]:
        return self.converged | ~self.finite | self.infeasible | self.stuck


@no_type_check
def _constrained_primal(inputs):
    """The augmented Lagrangian solve: `inputs -> ((y, eq multipliers, ineq
    multipliers), (loss, aux, state, result, stats))`.

    `fn` and the constraints are evaluated together at `y0` (through `jax.vjp`: the
    pull-back of the PHR function's partials in `(f, h, c)` is its gradient, the
    start of the first inner solve). After each inner solve only the constraints
    are evaluated, with their vjp, at its end point: the inner solve's last
    evaluation gave L and its gradient there, so `f = L - penalty`, and the gradient
    of the next L (new multipliers and penalty) is this one plus the pull-back of
    the change in the partials in `h` and `c`. Where those two differences would
    round beyond the tolerances (a large penalty, low precision), and always with
    `has_aux` (for its `aux`), `fn` is evaluated there too. The inner solver's state
    is carried from one inner solve to the next."""
    fn, constrained, y0, y_static, args, bounds, options = inputs
    method, constraints = constrained.method, constrained.constraints
    inner = LBFGSB() if method.inner is None else method.inner
    y_full = eqx.combine(y0, y_static)
    refs = []
    for name in ("eq", "ineq"):
        # The output structure at `y0`, checked, from an abstract trace (no call).
        box = []
        con = getattr(constraints, name)
        probe = lambda y, c=con, n=name, b=box: b.append(
            _constraint_values(c, y, args, n, jnp.float32)[1]
        )
        jax.eval_shape(probe, y_full)
        refs.append(box[0])
    loss = _AugmentedLoss(fn, constraints, options.has_aux, tuple(refs))

    def evaluate(y):
        """`(f, aux, h, c, vjp)` at `y`: one evaluation of `fn` and the constraints,
        `vjp` pulling cotangents of `(f, h, c)` back to `y`."""

        def parts(y):
            with loops(differentiable=True):
                f, aux, h, c = loss.evaluate(eqx.combine(y, y_static), args)
            return (f, h, c), aux

        (f, h, c), vjp, aux = jax.vjp(parts, y, has_aux=True)
        return f, aux, h, c, vjp

    def constraint_values(y):
        with loops(differentiable=True):
            return loss.values(eqx.combine(y, y_static), args, dtype)

    def start(f, h, c, vjp, lam_bar, mu_bar, rho):
        """The PHR function of the safeguarded multipliers and its gradient."""
        value, dh, dc = _phr(f, h, c, lam_bar, mu_bar, rho)
        (grad,) = vjp((jnp.ones_like(f), dh, dc))
        return value, grad

    f0, aux0, h0, c0, vjp0 = evaluate(y0)
    dtype = f0.dtype
    scalar = lambda v: jnp.asarray(v, dtype)
    atol = scalar(options.atol)
    tau, gamma = scalar(method.decrease), scalar(method.penalty_factor)
    cap, bound = scalar(method.max_penalty), scalar(method.multiplier_bound)
    squares = 0.5 * jnp.sum(jnp.square(h0)) + 0.5 * jnp.sum(
        jnp.square(jnp.maximum(-c0, 0))
    )
    # The value that balances f and the penalty (ALGENCAN's `comprhoini`, without
    # its factor 10).
    rho0 = jnp.clip(jnp.maximum(1, jnp.abs(f0)) / jnp.maximum(1, squares), 1e-8, 1e8)
    rho0 = jnp.minimum(rho0, cap)
    lam0, mu0 = jnp.zeros_like(h0), jnp.zeros_like(c0)
    # The inner tolerance omega and the feasibility target eta of Conn, Gould &
    # Toint (1991), Algorithm 1 (Nocedal & Wright's Algorithm 17.4 with the cap
    # gamma_1): alpha = min(1/rho, gamma_1), omega_1 = omega_s alpha_1, eta_1 =
    # alpha_1^0.1; omega_s = 1, or `initial_tolerance` / alpha_1.
    gamma1 = scalar(_GAMMA_1)
    alpha0 = jnp.minimum(1 / rho0, gamma1)
    if method.initial_tolerance is None:
        omega_scale, omega0 = scalar(1), alpha0
    else:
        omega0 = scalar(method.initial_tolerance)
        omega_scale = omega0 / alpha0
    L0, g0 = start(f0, h0, c0, vjp0, lam0, mu0, rho0)
    inf = scalar(jnp.inf)
    false = jnp.zeros((), bool)
    init = _Outer(
        num_steps=jnp.zeros((), jnp.int32),
        y=y0,
        lam=lam0,
        mu=mu0,
        rho=rho0,
        tol=jnp.maximum(atol, omega0),
        omega=omega0,
        eta=alpha0**0.1,
        prev_measure=inf,
        prev_violation=inf,
        f=f0,
        aux=aux0,
        h=h0,
        c=c0,
        L=L0,
        g=g0,
        state=inner.init(y0),
        num_fevals=jnp.ones((), jnp.int32),
        num_cevals=jnp.ones((), jnp.int32),
        converged=false,
        finite=jnp.isfinite(f0) & jnp.all(jnp.isfinite(h0)) & jnp.all(jnp.isfinite(c0)),
        infeasible=false,
        stuck=false,
    )
    max_steps = options.max_steps

    def body(o: _Outer) -> _Outer:
        lam_bar = jnp.clip(o.lam, -bound, bound)
        mu_bar = jnp.clip(o.mu, 0, bound)
        multipliers = (args, lam_bar, mu_bar, o.rho)
        problem = _Problem(loss, inner, y_static, multipliers, bounds)
        inner_options = _Options(
            method.inner_max_steps,
            options.rtol,
            o.tol,
            False,
            False,
            options.differentiable,
        )
        # The inner state carried over is a preconditioner, not a function of `args`
        # to differentiate: through it, unrolled derivatives would also follow how
        # the curvature pairs move (-2.42 instead of -1.414 on test_minimize_
        # constrained's circle; 3e-7 off without it).
        state0 = lax.stop_gradient(o.state)
        y, (L_end, _, state, result, stats), grad = _run(
            problem, o.y, inner_options, state0, start=(o.L, o.g)
        )
        if options.has_aux:
            f, aux, h, c, vjp = evaluate(y)
            fevals = o.num_fevals + stats["num_fevals"] + 1

            def next_start(lam, mu, rho, tol):  # pyright: ignore[reportRedeclaration]
                value, g = start(f, h, c, vjp, lam, mu, rho)
                return f, value, g, jnp.ones((), bool)

        else:
            # The inner solve ends with L and its gradient at `y`: f = L - penalty,
            # and the gradient of the next L differs from this one by J^T of the
            # change in its partial derivatives in h and c. So only the constraints
            # are evaluated (with their vjp), not `fn`, unless those differences
            # would cancel more than the tolerances allow (a large penalty term,
            # or low precision): then `fn` is evaluated at `y` as well.
            (h, c), cvjp = jax.vjp(constraint_values, y)
            zero = jnp.zeros((), dtype)
            penalty, dh_old, dc_old = _phr(zero, h, c, lam_bar, mu_bar, o.rho)
            f = f_derived = (L_end - penalty).astype(dtype)
            aux = o.aux
            fevals = o.num_fevals + stats["num_fevals"]
            eps = jnp.finfo(dtype).eps
            (pull_old,) = cvjp((dh_old, dc_old))
            grad_size = _max_abs(grad, dtype) + _max_abs(pull_old, dtype)
            f_error = eps * (jnp.abs(L_end) + jnp.abs(penalty))
            f_ok = 100 * f_error <= atol + options.rtol * jnp.abs(f_derived)

            def next_start(lam, mu, rho, tol):
                def derived():
                    value, dh, dc = _phr(f_derived, h, c, lam, mu, rho)
                    (pull,) = cvjp((dh, dc))
                    g = jtu.tree_map(lambda a, b, d: a - b + d, grad, pull_old, pull)
                    size = grad_size + _max_abs(pull, dtype)
                    return f_derived, value, g, f_ok & (100 * eps * size <= tol)

                def exact():
                    f, _, h_, c_, vjp = evaluate(y)
                    value, g = start(f, h_, c_, vjp, lam, mu, rho)
                    return f, value, g, jnp.zeros((), bool)

                f, value, g, ok = derived()
                return lax.cond(ok, lambda: (f, value, g, ok), exact)

        lam = lam_bar - o.rho * h
        mu = jnp.maximum(mu_bar - o.rho * c, 0)
        violation = _violation(h, c)
        measure = jnp.maximum(_inf_norm(h), _inf_norm(jnp.minimum(c, mu_bar / o.rho)))
        complementarity = _inf_norm(jnp.minimum(c, mu))
        keep = (o.num_steps == 0) | (measure <= tau * o.prev_measure)
        rho = jnp.where(keep, o.rho, jnp.minimum(gamma * o.rho, cap))
        infeasible = (
            (o.rho >= cap) & (violation > atol) & ~(violation <= tau * o.prev_violation)
        )
        at_target = o.tol <= atol
        feasible = (violation <= atol) & (complementarity <= atol)
        converged = at_target & (result == RESULTS.successful) & feasible
        finite = (
            (result != RESULTS.nonfinite)
            & jnp.all(jnp.isfinite(lam))
            & (jnp.all(jnp.isfinite(mu)))
        )
        # The inner solve can no longer decrease the loss at the final tolerance,
        # with the constraints satisfied: the limit of precision.
        stuck = (
            at_target
            & feasible
            & (
                (result == RESULTS.precision_limit)
                | (result == RESULTS.linesearch_failed)
            )
        )
        # Conn, Gould & Toint's update of omega and eta, with the next penalty: the
        # violation of the subproblem (`measure`, its slacks at their optimum) is
        # within eta: both shrink (omega by alpha, eta by alpha^0.9); else both
        # restart from the penalty (omega_s alpha, alpha^0.1).
        alpha = jnp.minimum(1 / rho, gamma1)
        met = measure <= o.eta
        omega = jnp.where(met, o.omega * alpha, omega_scale * alpha)
        eta = jnp.where(met, o.eta * alpha**0.9, alpha**0.1)
        tol = jnp.where(violation <= atol, atol, jnp.maximum(atol, omega))
        lam_next, mu_next = jnp.clip(lam, -bound, bound), jnp.clip(mu, 0, bound)
        # (`derived`: no evaluation of `fn` was needed for the next start.)
        f, L, g, derived = next_start(lam_next, mu_next, rho, tol)
        refreshed = (~derived).astype(jnp.int32)  # `fn` evaluated again at `y`
        num_fevals = fevals + refreshed
        finite = finite & jnp.isfinite(f)
        new = _Outer(
            num_steps=o.num_steps + 1,
            y=y,
            lam=lam,
            mu=mu,
            rho=rho,
            tol=tol,
            omega=omega,
            eta=eta,
            prev_measure=measure,
            prev_violation=violation,
            f=f,
            aux=aux,
            h=h,
            c=c,
            L=L,
            g=g,
            state=state,
            num_fevals=num_fevals,
            num_cevals=o.num_cevals + stats["num_fevals"] + 1 + refreshed,
            converged=converged,
            finite=finite,
            infeasible=infeasible,
            stuck=stuck,
        )
        return new

    out, history = run_loop(
        body, init, max_steps=max_steps, differentiable=options.differentiable
    )
    result = result_of(out.converged, out.finite, out.stuck, infeasible=out.infeasible)
    stats = {
        "num_steps": out.num_steps,
        "num_fevals": out.num_fevals,
        "num_cevals": out.num_cevals,
        "history": history,
        "max_violation": _violation(out.h, out.c),
    }
    root = (out.y, out.lam, out.mu)
    return root, (out.f, out.aux, out.state, result, stats)


@no_type_check
def _kkt(root, residual, inputs):
    """The KKT conditions, for the implicit adjoint: the projected gradient of the
    Lagrangian (with bounds), the equality constraints, and `min(ineq, mu)` (active
    inequalities hold with equality, inactive ones have `mu = 0`)."""
    fn, constrained, _, y_static, args, bounds, options = inputs
    y, lam, mu = root
    loss = _AugmentedLoss(fn, constrained.constraints, options.has_aux, None)

    def lagrangian(y):
        f, _, h, c = loss.evaluate(eqx.combine(y, y_static), args)
        return f - jnp.sum(lam * h) - jnp.sum(mu * c)

    grad = eqx.filter_grad(lagrangian)(y)
    if bounds is not None:
        grad = _gradient_measure(grad, y, bounds)
    _, _, h, c = loss.evaluate(eqx.combine(y, y_static), args)
    return grad, h, jnp.minimum(c, mu)


def _check_y0(y0):
    if not _leaves(y0):
        kinds = sorted(
            {str(getattr(x, "dtype", type(x).__name__)) for x in jtu.tree_leaves(y0)}
        )
        raise ValueError(
            "eqxopt.minimize: `y0` has no floating-point (or complex) JAX or NumPy "
            "array to optimize (only its inexact arrays are optimized); got "
            + (", ".join(kinds) if kinds else "an empty PyTree")
            + ". Pass e.g. `jnp.asarray(y0, jnp.float32)`."
        )


def minimize(
    fn: Callable[[PyTree, Any], Any],
    optimizer: AbstractOptimizer | AugmentedLagrangian,
    y0: PyTree,
    args: PyTree = None,
    *,
    max_steps: int = 256,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    has_aux: bool = False,
    throw: bool = True,
    progress: bool = False,
    adjoint: str = "unrolled",
    bounds: tuple[Any, Any] | None = None,
    constraints: Constraints | None = None,
) -> Solution:
    r"""Minimize `fn(y, args)` over `y`, starting from `y0`, with any eqxopt optimizer.

    Each step evaluates the loss and its gradient and calls
    `optimizer.update(grad, state, y, value=loss, grad=grad, value_fn=...)`, with
    Optax's `obj_fn=` (the loss, as `value_fn`) and `grad_fn=` (`(y, i) -> grad`) for
    the optimizers that evaluate the loss themselves (Sophia, SAM's opaque mode);
    optimizers that need none of the extra arguments ignore them. For complex leaves the
    optimizer receives the conjugated gradient (Optax's convention: descent along
    `-conj(grad)`). With [`eqxopt.LBFGS`][] or a
    bare line search, the loss and gradient at the new point come from the line
    search's last evaluation, so a step costs one evaluation when the first trial step
    is accepted.

    The loop is one bounded loop of at most `max_steps` iterations: Equinox's
    checkpointed `while_loop` (reverse-mode differentiable) when `minimize` is called
    under a JAX transformation with `adjoint="unrolled"`, else (an eager call, whose
    result nothing can differentiate, or the implicit adjoint) a plain
    `lax.while_loop`, which traces and compiles faster; the line searches' loops
    follow. It stops when

    $$\max_i |\nabla_y f(y, \text{args})_i| \le \text{atol} + \text{rtol}\,|f(y,
      \text{args})|$$

    at the current point; the remaining iterations cost nothing (the loop exits; no
    `lax.cond`, through which XLA would copy the whole state). It is compiled once per
    `fn`, optimizer structure and input shapes (as `equinox.filter_jit`: arrays
    traced, everything else static), with XLA's older CPU fusion emitters, which
    compile this loop of small kernels about twice as fast, as an LLVM module split
    in two parts compiled on two threads, and without XLA's CPU tree-reduction
    rewrite, which would split every reduction over more than 32 elements in two
    kernels (figures in the "Performance" section of the full-batch minimization
    guide); `fn` is traced once per compilation (the
    evaluations at `y0` and in the line search share the trace).

    **Arguments:**

    - `fn`: the loss, `fn(y, args) -> scalar`, or `-> (scalar, aux)` with
        `has_aux=True`.
    - `optimizer`: any [`eqxopt.AbstractOptimizer`][], e.g. `eqxopt.LBFGS()` or
        `eqxopt.Adam(1e-2)`.
    - `y0`: the starting point, any PyTree; only its inexact arrays are optimized
        (a whole `eqx.Module` works).
    - `args`: passed to `fn` unchanged; derivatives of the solution with respect to
        it are available (see `adjoint`).
    - `max_steps`: the number of iterations of the loop (keyword-only, as all below).
    - `rtol`, `atol`: the convergence tolerances above.
    - `has_aux`: whether `fn` returns `(loss, aux)`.
    - `throw`: raise an error naming the result (an `equinox.EquinoxRuntimeError`)
        when it is not `RESULTS.successful`; with `False`, check `sol.result`.
    - `progress`: show a live progress bar (step, loss) on stderr (tqdm when
        installed).
    - `bounds`: `None`, or `(lower, upper)` box constraints, each a PyTree prefix of
        `y0` (a scalar bounds every element; `None` or $\pm\infty$ leaves a side
        open). `y0` is projected into the box first and every iterate stays in it;
        convergence uses the projected gradient, $\max_i |P(y - \nabla f)_i - y_i|
        \le \text{atol} + \text{rtol}\,|f|$. [`eqxopt.LBFGSB`][] uses the bounds in
        its model; any other optimizer becomes a projected method (each new point is
        projected onto the box, and it sees the loss of the projected point).
        `lower > upper` or a NaN bound raises a `ValueError` naming the leaf (for
        traced bounds, under `vmap` or `jit`, with `throw=True`: an error when the
        solve runs).
    - `constraints`: `None`, or an [`eqxopt.Constraints`][]`(eq=..., ineq=...)`
        (`eq(y, args) == 0`, `ineq(y, args) >= 0`), solved with `optimizer=`
        [`eqxopt.AugmentedLagrangian`][]`()` (any other optimizer raises a
        `ValueError` naming it); the bounds stay in its inner solver. The
        `Solution` then has `multipliers`, and `stats` adds `max_violation` and
        `num_cevals`; steps are outer iterations, and a problem whose violation
        stalls at the penalty cap ends with `RESULTS.infeasible`.
    - `adjoint`: how derivatives of the solution with respect to `args` (and `y0`)
        are computed: `"unrolled"` (default) differentiates through the
        checkpointed loop, the line searches included; `"implicit"` uses the implicit
        function theorem at the optimum, $\partial y^* / \partial \text{args} =
        -(\nabla^2_{yy} f)^{-1} \nabla^2_{y\,\text{args}} f$, solved with lineax (as
        optimistix's `ImplicitAdjoint`): cheaper, and exact at an exact minimum.

    **Returns:**

    An [`eqxopt.Solution`][] with `value`, `loss`, `aux`, `state`, `result` and
    `stats` (`num_steps`, `num_fevals`, `history`). Under `jax.vmap` (over `y0`,
    `args` or `bounds`) every lane has its own; with `throw=False` a failing lane
    never affects the others. When the steps round away before the tolerances hold
    (a line search that cannot move the point beyond rounding, or 5 line-search
    steps in a row without decrease, or 5 first-order steps in a row that leave `y`,
    the optimizer's floating-point state and its hyperparameters unchanged), the
    solve stops with `RESULTS.precision_limit`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        def rosenbrock(y, args):
            return jnp.sum(100 * (y[1:] - y[:-1] ** 2) ** 2 + (1 - y[:-1]) ** 2)


        sol = eqxopt.minimize(rosenbrock, eqxopt.LBFGS(), jnp.zeros(4))
        assert sol.result == eqxopt.RESULTS.successful and jnp.allclose(sol.value, 1.0)
        ```
    """
    if constraints is not None and getattr(optimizer, "solves", None) != "constraints":
        raise ValueError(
            "eqxopt.minimize: `constraints` are solved by "
            "`eqxopt.AugmentedLagrangian()` (pass it as the optimizer; its `inner=` "
            f"solver handles the bounds), not by {type(optimizer).__name__}."
        )
    if constraints is not None and not isinstance(constraints, Constraints):
        raise ValueError(
            "eqxopt.minimize: `constraints` must be an `eqxopt.Constraints(eq=..., "
            f"ineq=...)`, got {type(constraints).__name__}."
        )
    kind = check_solver(
        "eqxopt.minimize",
        "optimizer",
        optimizer,
        ("loss", "constraints"),
        "an eqxopt optimizer (an `eqxopt.AbstractOptimizer`; wrap an Optax "
        "transformation with `eqxopt.from_optax`)",
        bounds=bounds,
        y0=y0,
    )
    check_options(
        "eqxopt.minimize", max_steps, adjoint, _ADJOINTS, rtol=rtol, atol=atol
    )
    _check_y0(y0)
    if bounds is not None:  # validate here, where concrete bounds can be checked
        check_bounds(bounds, eqx.filter(y0, is_param))
    options = _Options(
        int(max_steps), float(rtol), float(atol), bool(has_aux), bool(progress)
    )
    solve, solver = _solve, optimizer
    if kind == "constraints":
        solve = _solve_constrained
        method = typing.cast(AugmentedLagrangian, optimizer)
        if method.inner is not None:  # it takes the bounds (and solves a loss)
            check_solver(
                "eqxopt.minimize (the inner solver of `AugmentedLagrangian`)",
                "AugmentedLagrangian(inner=...)",
                method.inner,
                ("loss",),
                "an eqxopt optimizer of a loss (e.g. `eqxopt.LBFGSB()`)",
                bounds=bounds,
                y0=y0,
            )
        solver = _Constrained(method, constraints or Constraints())
    return jit_solve(
        "eqxopt.minimize",
        "optimizer",
        solve,
        (fn, solver, y0, args, bounds),
        options,
        bool(throw),
        ADJOINTS[adjoint],
    )
