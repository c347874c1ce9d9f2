"""`minimize`: drive any eqxopt optimizer to a minimum of a deterministic loss."""

import logging
import math
import sys
import types
from collections.abc import Callable
from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import lineax as lx
import numpy as np
import optimistix as optx
from jaxtyping import PyTree

from ._base import AbstractOptimizer
from ._misc import compute_dtype, is_param
from ._solution import RESULTS, Solution


_ADJOINTS = ("unrolled", "implicit")


def _strong(x):
    """`x` without a weak type (an explicit cast to its own dtype)."""
    return x.astype(x.dtype)


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
        else:
            loss, aux = out, None
        loss = jnp.asarray(loss)
        if loss.shape != () or not jnp.issubdtype(loss.dtype, jnp.floating):
            raise ValueError(
                "eqxopt.minimize: `fn` must return a real floating-point scalar loss"
                + (" (as the first element of its output)" if has_aux else "")
                + f", got an array of shape {loss.shape} and dtype {loss.dtype}."
            )
        return _strong(loss), aux

    return loss_and_aux


def _max_abs(tree, dtype):
    out = jnp.zeros((), dtype)
    for x in jtu.tree_leaves(tree):
        if is_param(x) and x.size > 0:
            out = jnp.maximum(out, jnp.max(jnp.abs(x)).astype(dtype))
    return out


def _all_finite(tree):
    out = jnp.ones((), bool)
    for x in jtu.tree_leaves(tree):
        if is_param(x):
            out = out & jnp.all(jnp.isfinite(x))
    return out


class _Progress:
    """A live progress bar on stderr (tqdm if installed, else a plain line)."""

    def __init__(self, max_steps: int):
        self.max_steps = max_steps
        self.bar = None
        self.last = 0

    def start(self):
        try:
            from tqdm.auto import tqdm
        except ImportError:  # pragma: no cover - tqdm is in the dev extra
            self.bar = None
        else:
            self.bar = tqdm(
                total=self.max_steps, desc="minimize", unit="step", file=sys.stderr
            )
        self.last = 0

    def update(self, step, loss):
        step = int(step)
        if self.bar is not None:
            self.bar.update(step - self.last)
            self.bar.set_postfix(loss=f"{float(loss):.6e}", refresh=False)
        else:
            print(
                f"\rminimize: step {step}/{self.max_steps}  loss {float(loss):.6e}",
                end="",
                file=sys.stderr,
                flush=True,
            )
        self.last = step

    def close(self, step, loss):
        self.update(step, loss)
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        else:
            print(file=sys.stderr, flush=True)


def _problem(fn, y_static, args, has_aux):
    """`(value_fn, value_and_grad)` of the loss over the optimized leaves `y`."""
    loss_and_aux = _split(fn, has_aux)

    def value_fn(y):
        return loss_and_aux(eqx.combine(y, y_static), args)[0]

    def value_aux(y):
        return loss_and_aux(eqx.combine(y, y_static), args)

    return value_fn, eqx.filter_value_and_grad(value_aux, has_aux=True)


def _step_impl(static, dynamic, carry):
    """One optimizer step of the solve (the body of the skip loop)."""
    treedef, leaves, has_aux, bar, rtol, atol = static
    fn, optimizer, y_static, args = eqx.combine(
        dynamic, jtu.tree_unflatten(treedef, leaves)
    )
    value_fn, value_and_grad = _problem(fn, y_static, args, has_aux)
    y, state, f, g, aux, num_steps, num_fevals, failed, _ = carry
    updates, state = optimizer.update(g, state, y, value=f, grad=g, value_fn=value_fn)
    y = eqx.apply_updates(y, updates)
    lookahead = getattr(optimizer, "_lookahead", None)
    cached = lookahead(state) if lookahead is not None else None
    if cached is None:
        (f, aux), g = value_and_grad(y)
        num_fevals = num_fevals + 1
        failed = jnp.zeros((), bool)
    else:
        value, grad, failed, evals = cached
        f = value.astype(f.dtype)
        g = jtu.tree_map(
            lambda new, old: None if old is None else new.astype(old.dtype),
            grad,
            g,
            is_leaf=lambda x: x is None,
        )
        num_fevals = num_fevals + evals
    num_steps = num_steps + jnp.where(failed, 0, 1).astype(jnp.int32)
    if bar is not None:
        jax.debug.callback(bar.update, num_steps, f, ordered=True)
    stop = _stopped(f, g, failed, rtol, atol)
    return y, state, f, g, aux, num_steps, num_fevals, failed, stop


def _converged(f, g, rtol, atol):
    """`max|g| <= atol + rtol |f|`, in at least float32."""
    dtype = compute_dtype(f.dtype, *(jnp.finfo(x.dtype).dtype for x in _leaves(g)))
    tol = jnp.asarray(atol, dtype) + jnp.asarray(rtol, dtype) * jnp.abs(f).astype(dtype)
    return _max_abs(g, dtype) <= tol


def _stopped(f, g, failed, rtol, atol):
    """Whether the solve stops at this point (converged, non-finite, or failed)."""
    finite = jnp.isfinite(f) & _all_finite(g)
    return _converged(f, g, rtol, atol) | ~finite | failed


# Jitted, so that the several traces of the loop body that the checkpointed loops make
# reuse one trace of the step (`jax.jit` caches it) instead of tracing it again.
_step_jit = jax.jit(_step_impl, static_argnums=0)


def _step(fn, optimizer, y_static, args, options, bar, carry):
    _, rtol, atol, has_aux, _ = options
    dynamic, static = eqx.partition((fn, optimizer, y_static, args), eqx.is_array)
    leaves, treedef = jtu.tree_flatten(static)
    key = (treedef, tuple(leaves), has_aux, bar, rtol, atol)
    try:
        hash(key)
    except TypeError:
        return _step_impl(key, dynamic, carry)
    return _step_jit(key, dynamic, carry)


def _chunk_size(max_steps):
    """Steps per chunk of the solve loop: about `sqrt(max_steps)`, so that both the
    number of chunks (each chunk left after convergence costs one test of its loop
    condition) and the length of the inner loops stay small."""
    return max(1, math.isqrt(max(max_steps - 1, 0)) + 1)


def _primal(inputs):
    """The solve: `inputs -> (y, residual)`. A global function (implicit_jvp needs
    one); everything it uses comes in through `inputs`."""
    fn, optimizer, y0, y_static, args, options = inputs
    max_steps, rtol, atol, has_aux, progress = options
    value_fn, value_and_grad = _problem(fn, y_static, args, has_aux)
    (f0, aux0), g0 = value_and_grad(y0)
    state0 = optimizer.init(y0)
    lookahead = getattr(optimizer, "_lookahead", None)
    uses_cache = lookahead is not None and lookahead(state0) is not None
    bar = _Progress(max_steps) if progress else None
    if bar is not None:
        jax.debug.callback(bar.start, ordered=True)

    # The `max_steps` iterations run as `num_chunks` chunks of up to `chunk` steps: a
    # scan over the chunks, each a bounded loop that stops as soon as the solve does.
    # So an iteration after convergence costs nothing (a whole chunk costs one test),
    # with no conditional (XLA would copy the whole carry through it) and no nested
    # loop per step. Both loops are checkpointed, so reverse-mode differentiable.
    chunk = _chunk_size(max_steps)
    num_chunks = -(-max_steps // chunk)

    def chunk_body(carry, start):
        def cond(c):
            j, carry, _ = c
            return ~carry[-1] & (j < jnp.minimum(chunk, max_steps - start))

        def body(c):
            j, carry, history = c
            f = carry[2]
            carry = _step(fn, optimizer, y_static, args, options, bar, carry)
            # A failed line search returns a zero step: that step is not applied.
            history = history.at[j].set(jnp.where(carry[7], jnp.nan, f).astype(f.dtype))
            return j + 1, carry, history

        history = jnp.full((chunk,), jnp.nan, carry[2].dtype)
        _, carry, history = eqxi.while_loop(
            cond,
            body,
            (jnp.zeros((), jnp.int32), carry, history),
            max_steps=chunk,
            buffers=lambda c: c[2],
            kind="checkpointed",
        )
        return carry, history

    int32 = lambda n: jnp.asarray(n, jnp.int32)
    false = jnp.zeros((), bool)
    stop0 = _stopped(f0, g0, false, rtol, atol)
    carry = (y0, state0, f0, g0, aux0, int32(0), int32(1), false, stop0)
    if max_steps > 0:
        starts = jnp.arange(num_chunks, dtype=jnp.int32) * chunk
        carry, history = eqxi.scan(
            chunk_body, carry, xs=starts, length=num_chunks, kind="checkpointed"
        )
        history = history.reshape(-1)[:max_steps]
    else:
        history = jnp.zeros((0,), f0.dtype)
    y, state, f, g, aux, num_steps, num_fevals, failed, _ = carry
    if has_aux and uses_cache:
        # The line search returns the loss and gradient at the new point, not `aux`.
        f, aux = _split(fn, has_aux)(eqx.combine(y, y_static), args)
        num_fevals = num_fevals + 1
    finite = jnp.isfinite(f) & _all_finite(g)
    result = RESULTS.where(
        finite & _converged(f, g, rtol, atol),
        RESULTS.successful,
        RESULTS.where(
            ~finite,
            RESULTS.nonfinite,
            RESULTS.where(failed, RESULTS.linesearch_failed, RESULTS.max_steps_reached),
        ),
    )
    if bar is not None:
        jax.debug.callback(bar.close, num_steps, f, ordered=True)
    stats = {"num_steps": num_steps, "num_fevals": num_fevals, "history": history}
    return y, (f, aux, state, result, stats)


def _rewrite(y, residual, inputs):
    """The optimality condition `grad fn(y, args) = 0`, for the implicit adjoint."""
    fn, _, _, y_static, args, options = inputs
    has_aux = options[3]
    loss_and_aux = _split(fn, has_aux)
    return eqx.filter_grad(lambda y: loss_and_aux(eqx.combine(y, y_static), args)[0])(y)


# `optx.internal.implicit_jvp` wants plain global functions.
for _f in (_primal, _rewrite):
    assert isinstance(_f, types.FunctionType) and _f.__closure__ is None


def _leaves(tree):
    return [x for x in jtu.tree_leaves(tree) if is_param(x)]


def _solve(fn, optimizer, y0, args, options, throw, adjoint):
    y_dyn, y_static = eqx.partition(y0, is_param)
    y_dyn = jtu.tree_map(_strong, y_dyn)
    inputs = (fn, optimizer, y_dyn, y_static, args, options)
    if adjoint == "implicit":
        y, (loss, aux, state, result, stats) = optx.internal.implicit_jvp(
            _primal,
            _rewrite,
            inputs,
            frozenset({lx.symmetric_tag}),
            lx.AutoLinearSolver(well_posed=None),
        )
        # Recompute the loss and aux outside the custom derivative, so that they are
        # differentiable too (through `y` and `args`).
        loss, aux = _split(fn, options[3])(eqx.combine(y, y_static), args)
        stats = dict(stats, num_fevals=stats["num_fevals"] + 1)
    else:
        y, (loss, aux, state, result, stats) = _primal(inputs)
    sol = Solution(
        value=eqx.combine(y, y_static),
        loss=loss,
        aux=aux,
        state=state,
        result=result,
        stats=stats,
    )
    if throw:
        sol = result.error_if(sol, result != RESULTS.successful)
    return sol


def _jit_body(dynamic, static, *rest):
    treedef, leaves = static
    leaves = [s if d is None else d for d, s in zip(dynamic, leaves)]
    fn, optimizer, y0, args = jtu.tree_unflatten(treedef, leaves)
    return _solve(fn, optimizer, y0, args, *rest)


# The solve is a loop of small, mostly scalar kernels: XLA's CPU compile time is
# dominated by code generation for each of them, which its older (non-MLIR) fusion
# emitters do about twice as fast, with the same run time. These options apply to this
# one compiled function only; other backends ignore them.
_COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
_jits = {
    True: jax.jit(
        _jit_body, static_argnums=(1, 2, 3, 4), compiler_options=_COMPILER_OPTIONS
    ),
    False: jax.jit(_jit_body, static_argnums=(1, 2, 3, 4)),
}
_use_options = [True]


class _DropEquinoxErrors(logging.Filter):
    def filter(self, record):
        return "_EquinoxRuntimeError" not in record.getMessage() and (
            record.exc_info is None
            or "_EquinoxRuntimeError" not in str(record.exc_info)
        )


def _call(jitted, *args):
    """Run, and turn an `eqx.error_if` failure into an `eqx.EquinoxRuntimeError` with
    its message (as `eqx.filter_jit` does)."""
    if not args[3]:  # `throw=False`: no error to catch
        return jitted(*args)
    logger = logging.getLogger("jax._src.callback")
    quiet = _DropEquinoxErrors()
    logger.addFilter(quiet)
    try:
        out = jitted(*args)
        if not any(isinstance(x, jax.core.Tracer) for x in jtu.tree_leaves(out)):
            jax.block_until_ready(out)
        return out
    except jax.errors.JaxRuntimeError as e:
        marker = "_EquinoxRuntimeError: "
        text = str(e)
        if marker not in text:
            raise
        message = text.split(marker, 1)[1].split("\n\n", 1)[0].strip()
        raise eqx.EquinoxRuntimeError(message) from None
    finally:
        logger.removeFilter(quiet)


def _minimize(fn, optimizer, y0, args, options, throw, adjoint):
    """`_solve` under `jit` (as `eqx.filter_jit`: arrays traced, the rest static)."""
    # One flatten (cheaper than `eqx.partition`): arrays are traced, the rest static.
    leaves, treedef = jtu.tree_flatten((fn, optimizer, y0, args))
    arrays = [eqx.is_array(x) for x in leaves]
    dynamic = [x if a else None for x, a in zip(leaves, arrays)]
    static = (treedef, tuple(None if a else x for x, a in zip(leaves, arrays)))
    try:
        hash(static)
    except TypeError:  # unhashable non-array leaves: let Equinox handle them
        return eqx.filter_jit(_solve)(fn, optimizer, y0, args, options, throw, adjoint)
    if _use_options[0]:
        try:
            return _call(_jits[True], dynamic, static, options, throw, adjoint)
        except Exception as e:  # an XLA without these options: compile without them
            if "xla_cpu_use_fusion_emitters" not in str(e):
                raise
            _use_options[0] = False
    return _call(_jits[False], dynamic, static, options, throw, adjoint)


def minimize(
    fn: Callable[[PyTree, Any], Any],
    optimizer: AbstractOptimizer,
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
) -> Solution:
    r"""Minimize `fn(y, args)` over `y`, starting from `y0`, with any eqxopt optimizer.

    Each step evaluates the loss and its gradient and calls
    `optimizer.update(grad, state, y, value=loss, grad=grad, value_fn=...)` (optimizers
    that need none of the extra arguments ignore them). With [`eqxopt.LBFGS`][] or a
    bare line search, the loss and gradient at the new point come from the line
    search's last evaluation, so a step costs one evaluation when the first trial step
    is accepted.

    The loop is one `equinox.internal.scan` of `max_steps` iterations (checkpointed,
    so reverse-mode differentiable), run in about $\sqrt{\text{max\_steps}}$ chunks:
    the scan is over the chunks, and each chunk is a bounded, checkpointed loop of up to
    $\sqrt{\text{max\_steps}}$ iterations. It stops when

    $$\max_i |\nabla_y f(y, \text{args})_i| \le \text{atol} + \text{rtol}\,|f(y,
      \text{args})|$$

    at the current point; the remaining iterations are skipped at (almost) no cost: the
    chunk's loop exits, and each later chunk costs one test of its loop condition (no
    `lax.cond`, through which XLA would copy the whole state). It is compiled once per
    `fn`, optimizer structure and input shapes (as `equinox.filter_jit`: arrays
    traced, everything else static), with XLA's older CPU fusion emitters, which
    compile this loop of small kernels about twice as fast.

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
    - `adjoint`: how derivatives of the solution with respect to `args` (and `y0`)
        are computed: `"unrolled"` (default) differentiates through the
        checkpointed loop, the line searches included; `"implicit"` uses the implicit
        function theorem at the optimum, $\partial y^* / \partial \text{args} =
        -(\nabla^2_{yy} f)^{-1} \nabla^2_{y\,\text{args}} f$, solved with lineax (as
        optimistix's `ImplicitAdjoint`): cheaper, and exact at an exact minimum.

    **Returns:**

    An [`eqxopt.Solution`][] with `value`, `loss`, `aux`, `state`, `result` and
    `stats` (`num_steps`, `num_fevals`, `history`).

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
    if not isinstance(optimizer, AbstractOptimizer):
        raise ValueError(
            "eqxopt.minimize: `optimizer` must be an eqxopt optimizer (an "
            f"`eqxopt.AbstractOptimizer`), got {type(optimizer).__name__}; wrap an "
            "Optax transformation with `eqxopt.from_optax`."
        )
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)):
        raise ValueError(
            f"eqxopt.minimize: `max_steps` must be an int >= 0, got {max_steps!r}."
        )
    if max_steps < 0:
        raise ValueError(
            f"eqxopt.minimize: `max_steps` must be an int >= 0, got {max_steps}."
        )
    if adjoint not in _ADJOINTS:
        raise ValueError(
            f"eqxopt.minimize: `adjoint` must be 'unrolled' or 'implicit', got "
            f"{adjoint!r}."
        )
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if not float(tol) >= 0:
            raise ValueError(f"eqxopt.minimize: `{name}` must be >= 0, got {tol}.")
    options = (int(max_steps), float(rtol), float(atol), bool(has_aux), bool(progress))
    return _minimize(fn, optimizer, y0, args, options, bool(throw), adjoint)
