"""General constraints for [`eqxopt.minimize`][]: `Constraints` and the safeguarded
augmented Lagrangian method that solves them (Birgin & Martínez 2014, ALGENCAN)."""

from collections.abc import Callable
from typing import Any

import equinox as eqx

from .._checks import concrete_scalar
from .._core.base import AbstractOptimizer, AbstractSolver


class Constraints(eqx.Module):
    """General constraints for [`eqxopt.minimize`][]`(..., constraints=...)`, solved
    by [`eqxopt.AugmentedLagrangian`][].

    - `eq(y, args) -> PyTree`: equality constraints, every entry `== 0`.
    - `ineq(y, args) -> PyTree`: inequality constraints, every entry `>= 0` (SciPy's
        convention).

    Either may be `None`. Each returns a PyTree of real floating-point arrays (of
    fixed shapes), and is called with the same `args` as the loss. Box constraints
    on `y` go in `minimize(..., bounds=...)`, where the inner solver keeps every
    iterate inside the box.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        # x + y = 1 and x >= 0.2
        constraints = eqxopt.Constraints(
            eq=lambda y, args: y[0] + y[1] - 1.0,
            ineq=lambda y, args: y[0] - 0.2,
        )
        sol = eqxopt.minimize(
            lambda y, args: jnp.sum(y**2),
            eqxopt.AugmentedLagrangian(),
            jnp.zeros(2),
            constraints=constraints,
        )
        assert jnp.allclose(sol.value, 0.5, atol=1e-5)
        ```
    """

    eq: Callable[[Any, Any], Any] | None = None
    ineq: Callable[[Any, Any], Any] | None = None

    def __check_init__(self):
        for name in ("eq", "ineq"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ValueError(
                    f"`Constraints({name}=...)` must be a function `(y, args) -> "
                    f"PyTree` or None, got {type(value).__name__}."
                )


class AugmentedLagrangian(AbstractSolver):
    r"""A safeguarded augmented Lagrangian method (ALGENCAN's outer loop, Birgin &
    Martínez 2014) for [`eqxopt.minimize`][]`(..., constraints=...)`.

    With $h(y) = 0$ the equality constraints and $c(y) \ge 0$ the inequalities,
    outer iteration $k$ minimises the Powell-Hestenes-Rockafellar function

    $$L_\rho(y) = f(y) + \frac\rho2\Big(\sum_i \big(h_i(y) - \bar\lambda_i/\rho
      \big)^2 + \sum_j \max\big(0, \bar\mu_j/\rho - c_j(y)\big)^2\Big)$$

    (up to a constant) with the inner solver, within the `bounds` of `minimize` (the
    bounds stay in the inner solver: every iterate is inside the box), then updates

    - the multipliers $\lambda = \bar\lambda - \rho h$, $\mu = \max(0, \bar\mu - \rho
      c)$, where $\bar\lambda, \bar\mu$ are the previous ones clipped to the
      safeguard box $[-B, B]$, $[0, B]$ (`multiplier_bound`);
    - the penalty: $\rho \leftarrow \gamma \rho$ (`penalty_factor`, up to
      `max_penalty`) unless $\max(\|h\|_\infty, \|\min(c, \bar\mu/\rho)\|_\infty)$
      (infeasibility and complementarity) decreased by the factor $\tau$
      (`decrease`) since the last outer iteration.

    The first penalty balances $f$ and the penalty term at `y0`, $\rho_1 = \max(10^{-8},
    \min(\max(1, |f|) / \max(1, \tfrac12\|h\|^2 + \tfrac12\|\max(0, -c)\|^2), 10^8))$
    (ALGENCAN's formula without its factor 10: a smaller first penalty leaves the first
    inner solve closer to minimising $f$, as on Hock-Schittkowski problem 15, where
    ALGENCAN's reaches a local minimum). Each inner solve starts from the last point
    with the inner solver's state where the last one ended (L-BFGS-B keeps its curvature
    pairs: the function changes only by the multipliers and the penalty).

    The inner solves' gradient tolerance is $\max(\text{atol}, \omega_k)$ (`atol`
    itself once the constraints hold to `atol`), by Conn, Gould & Toint's rule (1991,
    Algorithm 1; Nocedal & Wright's Algorithm 17.4 without its cap $\gamma_1 = 0.1$,
    LANCELOT's, which keeps the tolerance shrinking when $\rho \le 1$). With
    $\alpha_k = \min(1/\rho_k, \gamma_1)$, $\omega_1 = \omega_s\alpha_1$ and a
    feasibility target $\eta_1 = \alpha_1^{0.1}$; after inner solve $k$, with $v_k =
    \max(\|h\|_\infty, \|\min(c, \bar\mu/\rho)\|_\infty)$ its violation (that of the
    subproblem with slacks) and $\rho_{k+1}$ the penalty above,

    $$(\omega_{k+1}, \eta_{k+1}) = \begin{cases}
      (\omega_k\alpha_{k+1},\ \eta_k\alpha_{k+1}^{0.9}) & v_k \le \eta_k \\
      (\omega_s\alpha_{k+1},\ \alpha_{k+1}^{0.1}) & \text{otherwise}
    \end{cases}$$

    ($\omega_s = 1$ unless `initial_tolerance` sets $\omega_1$). So the tolerance is
    loose while the penalty is small and the multipliers poor, and shrinks at least
    tenfold with each outer iteration that makes enough progress towards
    feasibility.

    Outside the inner solves
    only the constraints are evaluated, once per outer iteration at the inner solve's
    end point (with their `jax.vjp`): the inner solve's last evaluation gave $L_\rho$
    and its gradient there, hence $f$, and the gradient of the next $L_\rho$ differs
    from this one by the pull-back of the change in its partial derivatives in $h$ and
    $c$, which starts the next inner solve without another call of `fn`. Those two
    differences are used only where their rounding error (from the sizes of $L_\rho$,
    the penalty and the gradients, times the dtype's epsilon, with a margin of 100) is
    within the tolerances; else `fn` is evaluated there as well (a large penalty, or
    low precision), as it always is with `has_aux=True`, for its `aux`. So `num_cevals`
    is at most `num_fevals` plus the outer iterations. The solve has converged when
    the constraint violation and the complementarity $\max_j |\min(c_j, \mu_j)|$ are
    at most `atol` and the projected gradient of the Lagrangian $\nabla f - J_h^\top
    \lambda - J_c^\top \mu$ passes `minimize`'s test at `atol`.
    The multipliers follow SciPy's sign convention: $\nabla f = J_h^\top\lambda +
    J_c^\top\mu$, $\mu \ge 0$. A solve whose violation stops decreasing (by less
    than the factor $\tau$) while the penalty is at `max_penalty` ends with
    `RESULTS.infeasible`.

    ??? cite "References"

        ```bibtex
        @article{conn1991globally,
            title={A Globally Convergent Augmented {L}agrangian Algorithm for
                   Optimization with General Constraints and Simple Bounds},
            author={Conn, Andrew R. and Gould, Nicholas I. M. and Toint, Philippe L.},
            journal={SIAM Journal on Numerical Analysis},
            volume={28}, number={2}, pages={545--572}, year={1991}}

        @book{nocedal2006numerical,
            title={Numerical Optimization}, edition={2nd},
            author={Nocedal, Jorge and Wright, Stephen J.},
            publisher={Springer}, year={2006}, note={Algorithm 17.4}}

        @book{birgin2014practical,
            title={Practical Augmented Lagrangian Methods for Constrained
                   Optimization},
            author={Birgin, Ernesto G. and Mart{\'\i}nez, Jos{\'e} Mario},
            publisher={SIAM}, year={2014}}

        @article{andreani2008augmented,
            title={On Augmented {L}agrangian Methods with General Lower-Level
                   Constraints},
            author={Andreani, R. and Birgin, E. G. and Mart{\'\i}nez, J. M. and
                    Schuverdt, M. L.},
            journal={SIAM Journal on Optimization},
            volume={18}, number={4}, pages={1286--1309}, year={2008}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt


        def loss(y, args):  # Hock-Schittkowski problem 6
            return (1 - y[0]) ** 2


        constraints = eqxopt.Constraints(eq=lambda y, args: 10 * (y[1] - y[0] ** 2))
        sol = eqxopt.minimize(
            loss,
            eqxopt.AugmentedLagrangian(),
            jnp.array([-1.2, 1.0]),
            constraints=constraints,
        )
        assert jnp.allclose(sol.value, 1.0, atol=1e-4)
        sol.multipliers["eq"], sol.stats["max_violation"]
        ```
    """

    inner: AbstractOptimizer | None = None
    penalty_factor: float = 10.0
    decrease: float = 0.5
    max_penalty: float = 1e10
    multiplier_bound: float = 1e20
    initial_tolerance: float | None = None
    inner_max_steps: int = eqx.field(default=500, static=True)

    solves = "constraints"
    real_only = (
        "constraints are real; split complex leaves into real and imaginary parts"
    )

    def __check_init__(self):
        if self.inner is not None and not isinstance(self.inner, AbstractOptimizer):
            raise ValueError(
                "`AugmentedLagrangian(inner=...)` must be an eqxopt optimizer (e.g. "
                f"`eqxopt.LBFGSB()`) or None, got {type(self.inner).__name__}."
            )
        rules = (
            ("penalty_factor", lambda v: v > 1, "> 1"),
            ("decrease", lambda v: 0 < v < 1, "in (0, 1)"),
            ("max_penalty", lambda v: v > 0, "> 0"),
            ("multiplier_bound", lambda v: v > 0, "> 0"),
            ("initial_tolerance", lambda v: v > 0, "> 0"),
        )
        for name, ok, rule in rules:
            if name == "initial_tolerance" and self.initial_tolerance is None:
                continue
            value = concrete_scalar(self, name, getattr(self, name))
            if value is not None and not ok(value):
                raise ValueError(
                    f"`AugmentedLagrangian({name}=...)` must be {rule}, got {value}."
                )
        steps = self.inner_max_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(
                "`AugmentedLagrangian(inner_max_steps=...)` must be an int >= 1, got "
                f"{steps!r}."
            )


AugmentedLagrangian.__init__.__doc__ = r"""**Arguments:**

- `inner`: the solver of each bound-constrained subproblem, any eqxopt optimizer;
    `None` (default) for [`eqxopt.LBFGSB`][]`()`. (Another optimizer is a projected
    method with `bounds`, as in `minimize`.)
- `penalty_factor`: $\gamma > 1$, the penalty's increase (ALGENCAN's 10).
- `decrease`: $\tau \in (0, 1)$, the decrease of infeasibility and complementarity
    that keeps the penalty (ALGENCAN's 0.5).
- `max_penalty`: the penalty's cap; a violation that stalls there ends the solve
    with `RESULTS.infeasible`.
- `multiplier_bound`: $B$, the safeguard box of the multipliers (ALGENCAN's 1e20).
- `initial_tolerance`: $\omega_1 > 0$, the first inner solve's gradient tolerance
    (at least `atol`), from which the later ones follow by the rule above; `None`
    (default) for the rule's own, $\omega_1 = \min(1/\rho_1, \gamma_1)$.
- `inner_max_steps`: the most steps of each inner solve. (Static.)
"""
