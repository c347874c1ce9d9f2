"""What [`eqxopt.minimize`][] and [`eqxopt.least_squares`][] share: the checks of
their arguments, which read what a solver declares (`AbstractSolver`'s class-level
facts) instead of testing its class; the loop's carry, the loop and its one
termination and result path; the adjoints, objects the solve calls around its loop;
and the one `jit` entry, which compiles a solve and turns its result into an error
when it failed."""

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
import numpy as np
import optimistix as optx
from jax.core import Tracer
from jax.extend.core import find_top_trace
from jaxtyping import Array, Bool, Int32, PyTree

from .._core.base import AbstractOptimizer
from .._misc import hashable, is_param
from .loop import CPU_OPTIONS, loops, Progress, while_loop
from .solution import RESULTS, Solution, succeeded


# What each kind of problem is solved by, for the error of a solver given to the
# wrong entry point (`AbstractSolver.solves`).
_ENTRY_OF = {
    "loss": "`eqxopt.minimize`",
    "residuals": "`eqxopt.least_squares`",
    "constraints": "`eqxopt.minimize(..., constraints=...)`",
}


def check_solver(
    entry: str,
    name: str,
    solver: Any,
    solves: tuple[str, ...],
    expected: str,
    *,
    bounds: Any,
    y0: Any,
) -> str:
    """Check `solver` (the argument `name` of `entry`) against its declarations: the
    problem it solves (one of `solves`; else a `ValueError` saying it must be
    `expected`), whether it takes `bounds`, whether it takes complex `y0`. Returns
    the problem it solves."""
    cls = type(solver)
    kind = getattr(cls, "solves", None)
    if kind not in solves:
        where = _ENTRY_OF.get(kind) if isinstance(kind, str) else None
        raise ValueError(
            f"{entry}: `{name}` must be {expected}, got {cls.__name__}"
            + (f" (a solver of {kind}: use it with {where})" if where else "")
            + "."
        )
    if bounds is not None and cls.refuses_bounds:
        raise ValueError(
            f"{entry}: `{cls.__name__}` does not take `bounds` ({cls.refuses_bounds})."
        )
    # (An optimizer's own `init` raises instead, naming the complex leaf.)
    if (
        cls.real_only
        and not isinstance(solver, AbstractOptimizer)
        and any(jnp.iscomplexobj(x) for x in jtu.tree_leaves(y0) if is_param(x))
    ):
        raise ValueError(
            f"{entry}: `{cls.__name__}` takes real `y0` only; complex parameters are "
            f"not supported ({cls.real_only})."
        )
    return kind


def check_options(
    entry: str, max_steps: Any, adjoint: Any, adjoints: tuple[str, ...], **tols: Any
) -> None:
    """The checks of the options every solve takes: `max_steps`, `adjoint` (one of
    `adjoints`, the first the default) and the tolerances (each `>= 0`)."""
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)):
        raise ValueError(
            f"{entry}: `max_steps` must be an int >= 0, got {max_steps!r}."
        )
    if max_steps < 0:
        raise ValueError(f"{entry}: `max_steps` must be an int >= 0, got {max_steps}.")
    if adjoint not in adjoints:
        raise ValueError(
            f"{entry}: `adjoint` must be {adjoints[0]!r} or {adjoints[1]!r}, got "
            f"{adjoint!r}."
        )
    for name, tol in tols.items():
        if not float(tol) >= 0:
            raise ValueError(f"{entry}: `{name}` must be >= 0, got {tol}.")


class Carry(eqx.Module):
    """The state of a solve between iterations, at the current point `y`: the loss
    `f` (with `least_squares`, the cost `0.5 |r|^2`), its gradient `g` (in the
    updates' convention: conjugated for complex leaves), `aux`, the solver's `state`,
    the counters and the verdicts at `y`, kept so that the result needs no new
    reductions (each costs compilation time): `converged` (the convergence test
    holds), `finite`, `stalled` (no further decrease is possible in floating point)
    and `failed` (the last step failed: a line search found no step). The fields
    after those belong to one entry point (`None` in the other's solve)."""

    y: PyTree
    f: Array
    g: PyTree
    aux: Any
    state: Any
    num_steps: Int32[Array, ""]
    num_fevals: Int32[Array, ""]
    converged: Bool[Array, ""]
    finite: Bool[Array, ""]
    stalled: Bool[Array, ""]
    failed: Bool[Array, ""]
    # `least_squares`: the residuals, their Jacobian (`None` when matrix-free) and the
    # Jacobian evaluations.
    r: Array | None = None
    J: Array | None = None
    num_jevals: Int32[Array, ""] | None = None
    # `minimize`: the accepted steps in a row that did not decrease the loss.
    no_decrease: Int32[Array, ""] | None = None

    @classmethod
    def start(cls, y, f, g, aux, state, *, converged, finite, **fields) -> "Carry":
        """The carry at `y0`: no step made, one evaluation (`fields`: the entry
        point's own)."""
        int32 = lambda n: jnp.asarray(n, jnp.int32)
        false = jnp.zeros((), bool)
        return cls(
            y=y,
            f=f,
            g=g,
            aux=aux,
            state=state,
            num_steps=int32(0),
            num_fevals=int32(1),
            converged=converged,
            finite=finite,
            stalled=false,
            failed=false,
            **fields,
        )

    @property
    def stop(self) -> Bool[Array, ""]:
        """Whether the solve stops here (converged, non-finite, stalled or failed)."""
        return self.converged | ~self.finite | self.failed | self.stalled

    @property
    def result(self) -> RESULTS:
        return result_of(self.converged, self.finite, self.stalled, self.failed)


def result_of(converged, finite, stalled, failed=None, infeasible=None) -> RESULTS:
    """How a solve ended, from its verdicts at the last point: successful when the
    convergence test holds there at finite values; else non-finite, a failed step,
    infeasible constraints, the limit of precision, or out of steps, in that order."""
    R = RESULTS
    out = R.where(stalled, R.precision_limit, R.max_steps_reached)
    if infeasible is not None:
        out = R.where(infeasible, R.infeasible, out)
    if failed is not None:
        out = R.where(failed, R.linesearch_failed, out)
    return R.where(finite & converged, R.successful, R.where(~finite, R.nonfinite, out))


class _Loop(eqx.Module):
    """The carry of `run_loop`'s loop: the iteration `j`, the solve's carry (a
    `Carry`, or any Module with `stop`, `f` and `num_steps`) and the history."""

    j: Int32[Array, ""]
    carry: Any
    # An array; inside the checkpointed loop, Equinox's wrapper of a loop buffer.
    history: Any


def run_loop(
    step: Callable[[Any], Any],
    carry: Any,
    *,
    max_steps: int,
    differentiable: bool,
    progress: str | None = None,
    record: Callable[[Any, Any], Array] | None = None,
) -> tuple[Any, Array]:
    """`carry` updated by `step` until `carry.stop` or `max_steps` iterations, and the
    history (length `max_steps`, NaN after the last iteration): `history[j]` is
    `record(before, after)` of iteration `j`, by default the loss before it.

    One bounded loop (checkpointed, so reverse-mode differentiable, where the solve
    can be differentiated: `differentiable`, which holds for the loops traced inside
    `step` too) that stops as soon as the solve does: an iteration after that costs
    nothing, with no conditional (XLA would copy the whole carry through it). The
    history is a write-only buffer of the loop. `progress`: the name of a live
    progress bar (step, loss) on stderr, or `None`."""
    bar = None if progress is None else Progress(max_steps, progress)
    if bar is not None:
        jax.debug.callback(bar.start, ordered=True)

    def cond(c: _Loop):
        return ~c.carry.stop & (c.j < max_steps)

    def body(c: _Loop):
        new = step(c.carry)
        value = c.carry.f if record is None else record(c.carry, new)
        if bar is not None:
            jax.debug.callback(bar.update, new.num_steps, new.f, ordered=True)
        return _Loop(c.j + 1, new, c.history.at[c.j].set(value))

    history = jnp.full((max_steps,), jnp.nan, carry.f.dtype)
    if max_steps > 0:
        init = _Loop(jnp.zeros((), jnp.int32), carry, history)
        with loops(differentiable):
            out = while_loop(
                cond, body, init, max_steps=max_steps, buffers=lambda c: c.history
            )
        carry, history = out.carry, out.history
    if bar is not None:
        jax.debug.callback(bar.close, carry.num_steps, carry.f, ordered=True)
    return carry, history


class AbstractAdjoint(eqx.Module):
    """How the solution of a solve is differentiated with respect to its inputs. The
    solve calls `prepare` on `fn` before tracing it and `solve` on its loop."""

    # Whether derivatives go through the loop: then a traced solve's loops must be
    # reverse-differentiable, and the loop's outputs carry derivatives.
    through_loop: ClassVar[bool]

    def prepare(self, fn: Callable, y0: Any, args: Any, tracing: bool) -> Callable:
        """`fn` as the solve traces it (`tracing`: called under a JAX transformation,
        whose tracers `fn` may close over)."""
        del y0, args, tracing
        return fn

    @abc.abstractmethod
    def solve(
        self, primal: Callable, rewrite: Callable, inputs: Any, tags: frozenset
    ) -> Any:
        """`primal(inputs) -> (root, residual)`, differentiable with respect to
        `inputs`. `rewrite(root, residual, inputs)` is zero at the solution (the
        optimality condition); `tags`: lineax's tags of its Jacobian in `root`."""


class Unrolled(AbstractAdjoint):
    """Differentiate through the loop (checkpointed: see `loop.while_loop`)."""

    through_loop = True

    def solve(self, primal, rewrite, inputs, tags):
        del rewrite, tags
        return primal(inputs)


class Implicit(AbstractAdjoint):
    """The implicit function theorem at the solution: the derivative of the root is
    that of `rewrite(root, ...) = 0`, solved with lineax (optimistix's
    `ImplicitAdjoint`). The loop is never differentiated."""

    through_loop = False

    def prepare(self, fn, y0, args, tracing):
        # `fn`'s closed-over tracers become its leaves, inputs of the custom
        # derivative (as optimistix does).
        return eqx.filter_closure_convert(fn, y0, args) if tracing else fn

    def solve(self, primal, rewrite, inputs, tags):
        return optx.internal.implicit_jvp(
            primal, rewrite, inputs, tags, lx.AutoLinearSolver(well_posed=None)
        )


ADJOINTS: dict[str, AbstractAdjoint] = {
    "unrolled": Unrolled(),
    "implicit": Implicit(),
}


# The trace that runs outside any transformation (`jit`, `grad`, `vmap`).
_EVAL_TRACE = type(find_top_trace(()))


def _jit_body(solve, dynamic, static, *rest):
    """`solve` on the inputs split by `jit_solve`. The `Solution`'s non-array leaves
    (those of `y0`, as an `eqx.nn.MLP`'s activation functions) leave the `jit` as
    static output, as in `eqx.filter_jit`."""
    treedef, leaves = static
    leaves = [s if d is None else d for d, s in zip(dynamic, leaves)]
    sol = solve(*jtu.tree_unflatten(treedef, leaves), *rest)
    arrays, others = eqx.partition(sol, eqx.is_array)
    return arrays, eqxi.Static(others)


# Only a top-level `jax.jit` takes compiler options: inside an outer trace (`jit`,
# `vmap`, `grad`), the solve is traced by the plain one.
_JIT = {
    "top": jax.jit(
        _jit_body, static_argnums=(0, 2, 3, 4, 5), compiler_options=CPU_OPTIONS
    ),
    "nested": jax.jit(_jit_body, static_argnums=(0, 2, 3, 4, 5)),
}


def jit_solve(
    entry: str,
    solver_name: str,
    solve: Callable,
    inputs: tuple[Any, Any, Any, Any, Any],
    options: Any,
    throw: bool,
    adjoint: AbstractAdjoint,
) -> Solution:
    """`solve(fn, solver, y0, args, bounds, options, throw_inside, adjoint)` under
    `jit`, as `eqx.filter_jit` (arrays traced, the rest static: the compilation key).

    Under an outer transformation (`jit`, `vmap`, `grad`; even when no input is a
    tracer, as `fn` may close over one) a failure raises through `eqx.error_if`
    inside the computation; called eagerly, the result is checked here, after the
    solve, and raised as an `eqx.EquinoxRuntimeError` prefixed with `entry`.
    `options` is a `NamedTuple` with a `differentiable` field, set here: reverse mode
    can reach the loops only through a traced call whose adjoint goes through them
    (an eager call's result is concrete); else they are plain loops, faster to trace
    and compile."""
    fn, solver, y0, args, bounds = inputs
    tracing = type(find_top_trace(())) is not _EVAL_TRACE
    fn = adjoint.prepare(fn, y0, args, tracing)
    # One flatten (cheaper than `eqx.partition`): arrays are traced, the rest static.
    leaves, treedef = jtu.tree_flatten((fn, solver, y0, args, bounds))
    arrays = [eqx.is_array(x) for x in leaves]
    traced = tracing or any(isinstance(x, Tracer) for x in leaves)
    options = options._replace(differentiable=traced and adjoint.through_loop)
    dynamic = [x if a else None for x, a in zip(leaves, arrays)]
    static = (treedef, tuple(None if a else x for x, a in zip(leaves, arrays)))
    if not hashable(static):
        names = ("fn", solver_name, "y0", "args", "bounds")
        _raise_unhashable(entry, dict(zip(names, (fn, solver, y0, args, bounds))))
    jitted = _JIT["nested" if traced else "top"]
    arrays, others = jitted(solve, dynamic, static, options, throw and traced, adjoint)
    sol = eqx.combine(arrays, others.value)
    if throw and not traced and not succeeded(sol.result):
        raise eqx.EquinoxRuntimeError(f"{entry}: " + RESULTS[sol.result])
    return sol


def _raise_unhashable(entry: str, inputs: dict[str, Any]):
    """The non-array parts of the inputs are the compilation key: name the first one
    that cannot be hashed."""
    for name, value in inputs.items():
        for path, leaf in jtu.tree_leaves_with_path(value):
            if not eqx.is_array(leaf) and not hashable(leaf):
                raise ValueError(
                    f"{entry}: `{name}{jtu.keystr(path)}` is a non-array leaf "
                    "(a static part of the compilation key, as in "
                    "`equinox.filter_jit`) that cannot be hashed: "
                    f"{type(leaf).__name__}. Pass arrays, hashable values, or a PyTree "
                    "(e.g. an `eqx.Module`) instead."
                )
    # (A PyTree structure hashed even with unhashable static data in a node, a list
    # in an `eqx.field(static=True)` or a registered node's aux data: jax 0.10.2.)
    raise AssertionError(f"{entry}: unhashable inputs, but no unhashable leaf")
