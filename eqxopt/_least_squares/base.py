"""The loop carry and the solver protocol of `eqxopt.least_squares`: a solver starts
from the residuals and Jacobian at `y0` and makes one outer iteration at a time (trial
steps until one is accepted or a test stops the solve); the loop, the results and the
adjoints are `least_squares`'s."""

import abc
from typing import Any, NamedTuple

import equinox as eqx
from jaxtyping import Array, Bool, Int32

from .._core.base import AbstractSolver
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


class Carry(eqx.Module):
    """The state of the solve between outer iterations, at the current point `x`:
    its residuals `r`, `aux`, Jacobian `J` (`None` when matrix-free), gradient
    `g = J^T r`, `cost = 0.5 |r|^2`, the solver's own state, the counters and the
    verdicts (`converged`: a convergence test held; `finite`; `stalled`: no trial step
    was accepted and no test held)."""

    x: Array
    r: Array
    aux: Any
    J: Array | None
    g: Array
    cost: Array
    state: Any
    num_steps: Int32[Array, ""]
    num_fevals: Int32[Array, ""]
    num_jevals: Int32[Array, ""]
    converged: Bool[Array, ""]
    finite: Bool[Array, ""]
    stalled: Bool[Array, ""]

    @property
    def stop(self) -> Bool[Array, ""]:
        return self.converged | ~self.finite | self.stalled


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
