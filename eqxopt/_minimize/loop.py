"""The bounded loops of the line searches and of `eqxopt.minimize`.

A loop that reverse mode may differentiate must be Equinox's checkpointed
`while_loop`; one that nothing can differentiate is a plain `lax.while_loop`, which
traces, lowers and compiles faster (no closure conversion, no custom derivative, no
buffer bookkeeping per carried leaf). `minimize` knows which case it is in: called
outside any JAX transformation its result is concrete (nothing can differentiate
it), and with `adjoint="implicit"` the loop is the primal of a custom derivative.
It says so with `loops(differentiable=False)` around the trace of its solve; the
loops traced inside that scope (its own and its line searches') are plain ones.
Evaluations of the user's function go back to differentiable loops (`minimize`
differentiates the function, which may contain line searches of its own).
"""

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator
from typing import Any

import equinox.internal as eqxi
import jax
import jax.lax as lax
import numpy as np


_DIFFERENTIABLE = contextvars.ContextVar("eqxopt_differentiable_loops", default=True)


@contextlib.contextmanager
def loops(differentiable: bool) -> Iterator[None]:
    """Within this scope (at trace time), `while_loop` builds reverse-differentiable
    loops (`True`, the default everywhere else) or plain ones (`False`)."""
    token = _DIFFERENTIABLE.set(differentiable)
    try:
        yield
    finally:
        _DIFFERENTIABLE.reset(token)


def while_loop(
    cond: Callable[[Any], Any],
    body: Callable[[Any], Any],
    init: Any,
    *,
    max_steps: int,
    buffers: Callable[[Any], Any] | None = None,
) -> Any:
    """`init` updated by `body` while `cond` holds, at most `max_steps` times.

    Differentiable: `equinox.internal.while_loop(..., kind="checkpointed")`, with
    `body` as one `jax.jit` (the checkpointed loop traces its body several times: its
    closure conversion, the forward and the backward pass; the `jit` traces it once,
    and the others re-bind one call instead of the body's primitives). Else a
    `lax.while_loop` with a step counter (`buffers` are then ordinary carried arrays,
    updated in place by XLA)."""
    if _DIFFERENTIABLE.get():
        return eqxi.while_loop(
            cond,
            jax.jit(body),
            init,
            max_steps=max_steps,
            buffers=buffers,
            kind="checkpointed",
        )

    def bounded_cond(carry):
        step, x = carry
        return (step < max_steps) & cond(x)

    def counted_body(carry):
        step, x = carry
        return step + 1, body(x)

    _, out = lax.while_loop(bounded_cond, counted_body, (np.zeros((), np.int32), init))
    return out


class Progress:
    """A live progress bar on stderr (tqdm if installed, else a plain line)."""

    def __init__(self, max_steps: int, desc: str):
        self.max_steps = max_steps
        self.desc = desc
        self.bar = None
        self.last = 0

    def start(self):
        try:
            from tqdm.auto import tqdm
        except ImportError:  # pragma: no cover - tqdm is in the dev extra
            self.bar = None
        else:
            self.bar = tqdm(
                total=self.max_steps, desc=self.desc, unit="step", file=sys.stderr
            )
        self.last = 0

    def update(self, step, loss):
        step = int(step)
        if self.bar is not None:
            self.bar.update(step - self.last)
            self.bar.set_postfix(loss=f"{float(loss):.6e}", refresh=False)
        else:
            print(
                f"\r{self.desc}: step {step}/{self.max_steps}  loss {float(loss):.6e}",
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


# The solve is a loop of small, mostly scalar kernels whose CPU compile time is mostly
# LLVM code generation: these per-computation options compile it faster, with the same
# iterates to the last bit (the measurements, and the options tried and not used, are
# in benchmarks/README.md, "Compiler options of the solve"). Other backends ignore them.
CPU_OPTIONS = (
    {
        "xla_cpu_use_fusion_emitters": False,
        "xla_cpu_parallel_codegen_split_count": 2,
        "xla_disable_hlo_passes": "tree_reduction_rewriter",
    }
    if (0, 5, 0) <= jax.__version_info__ < (0, 11, 0)
    else {}
)
