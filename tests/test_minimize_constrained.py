"""`minimize(..., constraints=...)` with `eqxopt.AugmentedLagrangian` (API.md section
10): Hock-Schittkowski problems with published solutions against SciPy's SLSQP in the
same process, multipliers against the KKT conditions, an infeasible problem, `jit`,
`vmap`, derivatives, bad input."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

import eqxopt


# Hock & Schittkowski (1981): (loss, eq, ineq, bounds, y0, published y*, f*).
def _hs6():
    return (
        lambda x, a: (1 - x[0]) ** 2,
        lambda x, a: 10 * (x[1] - x[0] ** 2),
        None,
        None,
        [-1.2, 1.0],
        [1.0, 1.0],
        0.0,
    )


def _hs7():
    return (
        lambda x, a: jnp.log(1 + x[0] ** 2) - x[1],
        lambda x, a: (1 + x[0] ** 2) ** 2 + x[1] ** 2 - 4,
        None,
        None,
        [2.0, 2.0],
        [0.0, np.sqrt(3.0)],
        -np.sqrt(3.0),
    )


def _hs21():
    return (
        lambda x, a: 0.01 * x[0] ** 2 + x[1] ** 2 - 100,
        None,
        lambda x, a: 10 * x[0] - x[1] - 10,
        ([2.0, -50.0], [50.0, 50.0]),
        [-1.0, -1.0],
        [2.0, 0.0],
        -99.96,
    )


def _hs35():
    def loss(x, a):
        return (
            9
            - 8 * x[0]
            - 6 * x[1]
            - 4 * x[2]
            + 2 * x[0] ** 2
            + 2 * x[1] ** 2
            + x[2] ** 2
            + 2 * x[0] * x[1]
            + 2 * x[0] * x[2]
        )

    return (
        loss,
        None,
        lambda x, a: 3 - x[0] - x[1] - 2 * x[2],
        (0.0, np.inf),
        [0.5, 0.5, 0.5],
        [4 / 3, 7 / 9, 4 / 9],
        1 / 9,
    )


def _hs71():
    return (
        lambda x, a: x[0] * x[3] * (x[0] + x[1] + x[2]) + x[2],
        lambda x, a: jnp.sum(x**2) - 40,
        lambda x, a: jnp.prod(x) - 25,
        (1.0, 5.0),
        [1.0, 5.0, 5.0, 1.0],
        [1.0, 4.7429994, 3.8211503, 1.3794082],
        17.0140173,
    )


def _hs15():
    return (
        lambda x, a: 100 * (x[1] - x[0] ** 2) ** 2 + (1 - x[0]) ** 2,
        None,
        lambda x, a: jnp.stack([x[0] * x[1] - 1, x[0] + x[1] ** 2]),
        ([-np.inf, -np.inf], [0.5, np.inf]),
        [-2.0, 1.0],
        [0.5, 2.0],
        306.5,
    )


PROBLEMS = {
    "hs6": _hs6,
    "hs7": _hs7,
    "hs21": _hs21,
    "hs35": _hs35,
    "hs71": _hs71,
    "hs15": _hs15,
}


_CACHE = {}


def _multipliers(sol) -> Any:
    assert sol.multipliers is not None
    return sol.multipliers


def _solved(name):
    """`(ours, SLSQP's)` on problem `name`, solved once per test session."""
    if name not in _CACHE:
        _CACHE[name] = (_solve(name, throw=False), _slsqp(name))
    return _CACHE[name]


def _solve(name, method=None, scale=1.0, **kwargs):
    """Problem `name` by `method` (default `AugmentedLagrangian()`), its objective
    times `scale`."""
    loss, eq, ineq, bounds, y0, _, _ = PROBLEMS[name]()
    if bounds is not None:
        bounds = (jnp.asarray(bounds[0], float), jnp.asarray(bounds[1], float))
    return eqxopt.minimize(
        lambda y, args: scale * loss(y, args),
        eqxopt.AugmentedLagrangian() if method is None else method,
        jnp.asarray(y0, jnp.float64),
        constraints=eqxopt.Constraints(eq=eq, ineq=ineq),
        bounds=bounds,
        **kwargs,
    )


def _slsqp(name):
    loss, eq, ineq, bounds, y0, _, _ = PROBLEMS[name]()
    constraints = []
    for kind, con in (("eq", eq), ("ineq", ineq)):
        if con is not None:
            value = jax.jit(lambda x, con=con: jnp.atleast_1d(con(x, None)))
            jac = jax.jit(jax.jacobian(lambda x, con=con: jnp.atleast_1d(con(x, None))))
            constraints.append(
                dict(
                    type=kind,
                    fun=lambda x, v=value: np.asarray(v(jnp.asarray(x))),
                    jac=lambda x, j=jac: np.asarray(j(jnp.asarray(x))),
                )
            )
    value_and_grad = jax.jit(jax.value_and_grad(lambda x: loss(x, None)))
    n = len(y0)
    box = None
    if bounds is not None:
        lower, upper = (np.broadcast_to(np.asarray(b, float), (n,)) for b in bounds)
        box = list(zip(lower, upper))
    return scipy.optimize.minimize(
        lambda x: tuple(np.asarray(v) for v in value_and_grad(jnp.asarray(x))),
        np.asarray(y0, float),
        jac=True,
        method="SLSQP",
        bounds=box,
        constraints=constraints,
        options=dict(ftol=1e-10, maxiter=500),
    )


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_published_solutions_as_slsqp(name):
    _, _, _, _, _, y_star, f_star = PROBLEMS[name]()
    sol, ref = _solved(name)
    assert sol.result == eqxopt.RESULTS.successful
    # (SLSQP reaches HS7's solution but, at ftol=1e-10, never reports success.)
    assert ref.success or name == "hs7"
    assert np.allclose(ref.x, y_star, rtol=0, atol=1e-5)
    assert np.allclose(sol.value, y_star, rtol=0, atol=1e-5)
    assert np.allclose(sol.loss, f_star, rtol=1e-6, atol=1e-6)
    assert np.allclose(sol.value, ref.x, rtol=0, atol=1e-5)
    assert float(sol.stats["max_violation"]) <= 1e-8
    # (After each inner solve only the constraints are evaluated.)
    assert int(sol.stats["num_cevals"]) == int(sol.stats["num_fevals"]) + int(
        sol.stats["num_steps"]
    )
    assert int(sol.stats["num_steps"]) >= 1


@pytest.mark.parametrize("name", ["hs6", "hs7", "hs35", "hs21", "hs71", "hs15"])
def test_multipliers_satisfy_kkt(name):
    # grad f = J_eq^T lam + J_ineq^T mu, mu >= 0, mu * ineq = 0 (SciPy's convention),
    # in the variables whose bounds are inactive at the solution (else the bounds'
    # own multipliers enter): HS21's and HS71's x1 sit at their lower bounds, HS15's
    # at its upper one.
    loss, eq, ineq, _, _, _, _ = PROBLEMS[name]()
    sol, ref = _solved(name)
    assert sol.result == eqxopt.RESULTS.successful
    y = sol.value
    residual = jax.grad(loss)(y, None)
    if eq is not None:
        residual -= jnp.atleast_2d(jax.jacobian(eq)(y, None)).T @ jnp.atleast_1d(
            _multipliers(sol)["eq"]
        )
    else:
        assert _multipliers(sol)["eq"] is None
    if ineq is not None:
        mu = jnp.atleast_1d(_multipliers(sol)["ineq"])
        assert np.all(mu >= 0)
        assert np.allclose(mu * jnp.atleast_1d(ineq(y, None)), 0, atol=1e-5)
        residual -= jnp.atleast_2d(jax.jacobian(ineq)(y, None)).T @ mu
    free = slice(1, None) if name in ("hs21", "hs71", "hs15") else slice(None)
    # (The inner solve stops at max|grad| <= atol + rtol |loss|: 3.1e-4 on HS15.)
    assert np.allclose(residual[free], 0, atol=1e-5 + 1e-6 * abs(float(sol.loss)))
    ours = np.concatenate(
        [
            np.atleast_1d(_multipliers(sol)[k])
            for k in ("eq", "ineq")
            if _multipliers(sol)[k] is not None
        ]
    )
    assert np.allclose(ours, ref.multipliers, rtol=1e-4, atol=1e-5)


def _counted(calls, key, f):
    """`f`, counting its real calls in `calls[key]`."""

    def bump():
        calls[key] += 1

    def wrapped(x, a):
        jax.debug.callback(bump)
        return f(x, a)

    return wrapped


def test_counters_count_real_calls():
    # After each inner solve only the constraints are evaluated (with their vjp):
    # num_fevals counts the calls of fn, num_cevals those of the constraints.
    loss, eq, ineq, bounds, y0, _, _ = PROBLEMS["hs71"]()
    calls = {"fn": 0, "eq": 0}
    sol = eqxopt.minimize(
        _counted(calls, "fn", loss),
        eqxopt.AugmentedLagrangian(),
        jnp.asarray(y0, jnp.float64),
        constraints=eqxopt.Constraints(eq=_counted(calls, "eq", eq), ineq=ineq),
        bounds=(jnp.asarray(bounds[0], float), jnp.asarray(bounds[1], float)),
    )
    jax.effects_barrier()
    assert sol.result == eqxopt.RESULTS.successful
    assert calls["fn"] == int(sol.stats["num_fevals"])
    assert calls["eq"] == int(sol.stats["num_cevals"])
    assert calls["eq"] == calls["fn"] + int(sol.stats["num_steps"])


def test_fn_is_evaluated_again_where_derived_values_would_round_too_much():
    # Constraints that cannot hold together drive the penalty to its cap: there, f
    # and the next gradient derived from the inner solve's last evaluation (L minus
    # a penalty of about 1e9) would lose more than the tolerances allow, so fn is
    # evaluated again at the inner solve's end point (with the constraints), and
    # counted.
    calls = {"fn": 0, "eq": 0}
    sol = eqxopt.minimize(
        _counted(calls, "fn", lambda y, args: jnp.sum(y**2)),
        eqxopt.AugmentedLagrangian(),
        jnp.array([0.3, 0.2]),
        constraints=eqxopt.Constraints(
            eq=_counted(calls, "eq", lambda y, args: jnp.stack([y[0], y[0] - 1]))
        ),
        throw=False,
    )
    jax.effects_barrier()
    assert sol.result == eqxopt.RESULTS.infeasible
    assert calls["fn"] == int(sol.stats["num_fevals"])
    assert calls["eq"] == int(sol.stats["num_cevals"])
    # The loss is fn at the solution (derived, it would be 0.25 instead of about
    # 0.2499999: rounded at a penalty of 3e9).
    assert np.isclose(float(sol.loss), float(jnp.sum(sol.value**2)), rtol=1e-12)


def test_inner_tolerance_schedule():
    """The rule's first inner tolerance is min(1/rho_1, 0.1) (Conn, Gould & Toint):
    setting `initial_tolerance` to that value gives the same solve, evaluation for
    evaluation, and a first tolerance 0.7 times as large gives another (the later
    tolerances scale with it). Both branches of the min: HS7, where rho_1 =
    max(1, |f(y0)|) / max(1, |h(y0)|^2 / 2) = 0.0032, so the cap 0.1; and HS71 with
    its objective times 100, where rho_1 = 100 * 16 / (12^2 / 2), so 1/rho_1 = 0.045
    (its inequality holds at y0)."""

    def run(name, tol, scale):
        method = eqxopt.AugmentedLagrangian(initial_tolerance=tol)
        sol = _solve(name, method, scale, throw=False)
        assert sol.result == eqxopt.RESULTS.successful
        return int(sol.stats["num_fevals"]), float(sol.loss)

    for name, scale, first in (("hs7", 1.0, 0.1), ("hs71", 100.0, 72 / 1600)):
        default = run(name, None, scale)
        assert run(name, first, scale) == default
        assert run(name, 0.7 * first, scale) != default


def test_pytree_constraints_keep_their_structure():
    def loss(y, args):
        return jnp.sum(y["a"] ** 2) + jnp.sum(y["b"] ** 2)

    constraints = eqxopt.Constraints(
        eq=lambda y, args: {"sum": jnp.sum(y["a"]) - 1.0},
        ineq=lambda y, args: (y["b"] - args,),
    )
    sol = eqxopt.minimize(
        loss,
        eqxopt.AugmentedLagrangian(),
        {"a": jnp.zeros(2), "b": jnp.zeros(3)},
        jnp.array([0.5, -1.0, 0.0]),
        constraints=constraints,
    )
    assert np.allclose(sol.value["a"], 0.5, atol=1e-6)
    assert np.allclose(sol.value["b"], [0.5, 0.0, 0.0], atol=1e-6)
    assert set(_multipliers(sol)["eq"]) == {"sum"}
    assert np.allclose(_multipliers(sol)["eq"]["sum"], 1.0, atol=1e-5)
    (mu,) = _multipliers(sol)["ineq"]
    assert mu.shape == (3,)
    assert np.allclose(mu, [1.0, 0.0, 0.0], atol=1e-5)


def test_infeasible():
    constraints = eqxopt.Constraints(
        eq=lambda y, args: y[0] + y[1] - 3.0, ineq=lambda y, args: 1.0 - y
    )

    def loss(y, args):
        return jnp.sum(y**2)

    sol = eqxopt.minimize(
        loss,
        eqxopt.AugmentedLagrangian(),
        jnp.zeros(2),
        constraints=constraints,
        throw=False,
    )
    assert sol.result == eqxopt.RESULTS.infeasible
    assert float(sol.stats["max_violation"]) > 0.1
    with pytest.raises(eqx.EquinoxRuntimeError, match="infeasible"):
        eqxopt.minimize(
            loss, eqxopt.AugmentedLagrangian(), jnp.zeros(2), constraints=constraints
        )


def _circle(y0, radius):
    return eqxopt.minimize(
        lambda y, r: y[0] + y[1],
        eqxopt.AugmentedLagrangian(),
        y0,
        radius,
        constraints=eqxopt.Constraints(eq=lambda y, r: jnp.sum(y**2) - r**2),
        throw=False,
    )


def test_jit_vmap_lanes_equal_single_solves():
    y0 = jnp.array([[1.0, 0.0], [-0.5, -0.5], [0.2, 1.0]])
    radius = jnp.array([1.0, 2.0, 0.5])
    batch = jax.jit(jax.vmap(_circle))(y0, radius)
    for i in range(3):
        single = _circle(y0[i], radius[i])
        lane = jax.tree.map(lambda x: x[i], batch)
        assert bool(lane.result == single.result)
        # (Equal up to rounding, in the same numbers of steps and evaluations:
        # batched reductions round differently, and the last inner solve stops at
        # max|grad| <= atol + rtol |loss| (2.8e-6 at radius 2), which fixes the end
        # point along the circle only to about that. Measured 4.4e-8 apart at radius
        # 2, 2e-12 on the others.)
        assert np.allclose(lane.value, single.value, rtol=0, atol=1e-7)
        assert np.allclose(_multipliers(lane)["eq"], _multipliers(single)["eq"])
        for key in ("num_steps", "num_fevals", "num_cevals"):
            assert int(lane.stats[key]) == int(single.stats[key]), key
        expected = -radius[i] / np.sqrt(2.0)
        assert np.allclose(lane.value, expected, atol=1e-6)


@pytest.mark.parametrize("adjoint", ["unrolled", "implicit"])
def test_derivative_with_respect_to_args(adjoint):
    # min y0 + y1 on |y| = r: y* = -r / sqrt(2) (1, 1), dy*/dr = -1 / sqrt(2).
    def solution(r):
        return eqxopt.minimize(
            lambda y, r: y[0] + y[1],
            eqxopt.AugmentedLagrangian(),
            jnp.array([1.0, 0.0]),
            r,
            constraints=eqxopt.Constraints(eq=lambda y, r: jnp.sum(y**2) - r**2),
            adjoint=adjoint,
        ).value

    # One reverse pass (`jax.grad` of y0 + y1, not `jax.jacobian`, which would vmap
    # the backward pass through the nested loops over both outputs):
    # d(y0 + y1)/dr = -sqrt(2).
    grad = jax.grad(lambda r: jnp.sum(solution(r)))(jnp.asarray(1.5))
    # Through the loops, the derivative is that of the iterations, which stop at
    # the tolerance: measured 3e-7 off; the implicit one is exact at the optimum.
    atol = 1e-5 if adjoint == "implicit" else 1e-4
    assert np.allclose(grad, -np.sqrt(2.0), atol=atol)


def test_bad_input():
    def loss(y, args):
        return jnp.sum(y**2)

    y0 = jnp.zeros(2)
    good = eqxopt.Constraints(eq=lambda y, args: y[0] - 1.0)
    with pytest.raises(ValueError, match="AugmentedLagrangian"):
        eqxopt.minimize(loss, eqxopt.LBFGSB(), y0, constraints=good)
    with pytest.raises(ValueError, match="Constraints"):
        eqxopt.minimize(
            loss,
            eqxopt.AugmentedLagrangian(),
            y0,
            constraints=lambda y, a: y,  # pyright: ignore[reportArgumentType]
        )
    # (TypeError: from the test suite's runtime type checker.)
    with pytest.raises((ValueError, TypeError), match="eq"):
        eqxopt.Constraints(eq=3.0)  # pyright: ignore[reportArgumentType]
    for bad in ("a string", 1, True):
        with pytest.raises(ValueError, match="constraints.ineq"):
            eqxopt.minimize(
                loss,
                eqxopt.AugmentedLagrangian(),
                y0,
                constraints=eqxopt.Constraints(ineq=lambda y, a, b=bad: b),
            )
    calls = []

    def changing(y, args):  # a different shape on every trace
        calls.append(None)
        return y[: len(calls)]

    with pytest.raises(ValueError, match="shapes"):
        eqxopt.minimize(
            loss,
            eqxopt.AugmentedLagrangian(),
            y0,
            constraints=eqxopt.Constraints(eq=changing),
        )
    with pytest.raises(ValueError, match="penalty_factor"):
        eqxopt.AugmentedLagrangian(penalty_factor=0.5)
    with pytest.raises(ValueError, match="decrease"):
        eqxopt.AugmentedLagrangian(decrease=1.0)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="initial_tolerance"):
            eqxopt.AugmentedLagrangian(initial_tolerance=bad)
    with pytest.raises((ValueError, TypeError), match="inner"):
        eqxopt.AugmentedLagrangian(inner="lbfgsb")  # pyright: ignore[reportArgumentType]
    # The inner solver keeps the bounds: one that takes none says so before solving.
    box = (jnp.zeros(2), jnp.ones(2))
    with pytest.raises(ValueError, match="inner solver.*NewtonCG.*bounds.*LBFGSB"):
        eqxopt.minimize(
            loss,
            eqxopt.AugmentedLagrangian(inner=eqxopt.NewtonCG()),
            y0,
            constraints=good,
            bounds=box,
        )
