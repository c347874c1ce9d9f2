"""The solver protocol of `eqxopt.least_squares`: a solver starts from the residuals
and Jacobian at `y0` and makes one outer iteration at a time (trial steps until one is
accepted or a test stops the solve); the carry, the loop, the results and the adjoints
are the solve's (`_minimize/solve.py`)."""

import abc
from typing import Any, NamedTuple

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, PyTree

from .._core.base import AbstractSolver
from .._minimize.solve import Carry
from .common import Problem


class Options(NamedTuple):
    """The static options of a solve (part of the compilation key)."""

    max_steps: int
    ftol: float
    xtol: float
    gtol: float
    has_aux: bool
    progress: bool
    differentiable: bool = True


# Trial steps per outer iteration: each rejection shrinks the trust region at least
# fourfold, so the `xtol` test holds long before this many.
MAX_TRIALS = 64


class AbstractLeastSquaresSolver(AbstractSolver):
    """A solver of `eqxopt.least_squares`: `jac` and `x_scale` (SciPy's), and two
    methods. It needs the residuals and their Jacobian, or with `jac="matrix-free"`
    Jacobian products only (`Problem`)."""

    jac: eqx.AbstractVar[str]
    x_scale: eqx.AbstractVar[Any]

    solves = "residuals"
    real_only = "fit the real and imaginary parts as two real arrays"

    @abc.abstractmethod
    def start(self, problem: Problem, carry: Carry, options: Options) -> Carry:
        """The carry at `y0` with the solver's state and the first convergence test."""

    @abc.abstractmethod
    def iterate(self, problem: Problem, carry: Carry, options: Options) -> Carry:
        """One outer iteration: trial steps until one is accepted (then the Jacobian
        at the new point) or a test holds."""


def next_carry(
    carry: Carry,
    accepted: Bool[Array, ""],
    *,
    y: Array,
    r: Array,
    aux: PyTree,
    J: Array | None,
    g: Array,
    f: Array,
    state: Any,
    num_fevals: Array,
    converged: Bool[Array, ""],
    stalled: Bool[Array, ""],
) -> Carry:
    """The carry after an outer iteration from `carry`, at the point `y` (the new one
    when a trial step was `accepted`, else the old): a step and a Jacobian evaluation
    are counted when one was, and the values there are checked to be finite."""
    finite = jnp.isfinite(f) & jnp.all(jnp.isfinite(g))
    if J is not None:
        finite = finite & jnp.all(jnp.isfinite(J))
    count = accepted.astype(np.int32)
    return Carry(
        y=y,
        f=f,
        g=g,
        aux=aux,
        state=state,
        num_steps=carry.num_steps + count,
        num_fevals=num_fevals,
        converged=converged,
        finite=finite,
        stalled=stalled,
        failed=carry.failed,
        r=r,
        J=J,
        num_jevals=None if carry.num_jevals is None else carry.num_jevals + count,
    )
