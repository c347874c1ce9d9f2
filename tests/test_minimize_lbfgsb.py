"""L-BFGS-B and box constraints in `eqxopt.minimize` (design.md#conventions):
SciPy's L-BFGS-B as the reference, the unbounded case equal to L-BFGS, projected
first-order methods, bound validation, derivatives with active bounds, `jax.vmap`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

import eqxopt


def rosenbrock(y, args):
    return jnp.sum(100.0 * (y[1:] - y[:-1] ** 2) ** 2 + (1.0 - y[:-1]) ** 2)


def _scipy(fn, y0, lower, upper, args=None):
    y0 = np.asarray(y0, np.float64)
    value_and_grad = jax.jit(jax.value_and_grad(fn))
    return scipy.optimize.minimize(
        lambda y: tuple(np.asarray(v) for v in value_and_grad(jnp.asarray(y), args)),
        y0,
        jac=True,
        method="L-BFGS-B",
        bounds=list(
            zip(np.broadcast_to(lower, y0.shape), np.broadcast_to(upper, y0.shape))
        ),
        options=dict(gtol=1e-10, ftol=0.0, maxiter=1000),
    )


def test_matches_scipy_lbfgsb_on_bounded_rosenbrock():
    y0 = jnp.tile(jnp.array([-1.2, 1.0]), 5)
    sol = eqxopt.minimize(
        rosenbrock,
        eqxopt.LBFGSB(),
        y0,
        bounds=(-2.0, 0.5),
        rtol=0.0,
        atol=1e-10,
        max_steps=500,
    )
    ref = _scipy(rosenbrock, y0, -2.0, 0.5)
    assert sol.result == eqxopt.RESULTS.successful
    assert np.allclose(sol.value, ref.x, rtol=1e-6, atol=1e-8)
    active = np.asarray(sol.value) == 0.5
    assert np.array_equal(active, np.isclose(ref.x, 0.5, rtol=0, atol=1e-12))
    assert active[0] and active.sum() == 1  # the first variable is held at 0.5
    # Evaluation counts: SciPy needs 35 here; eqxopt measured 28. Allow 20% over
    # SciPy (the line searches differ: Zoom vs. More-Thuente).
    assert int(sol.stats["num_fevals"]) <= 1.2 * ref.nfev


@pytest.mark.parametrize("upper", [1.0, 0.3])
def test_quadratic_with_many_active_bounds_matches_scipy(upper, getkey):
    n = 40
    a = jax.random.normal(getkey(), (n, n))
    matrix = a @ a.T / n + 0.1 * jnp.eye(n)
    b = 3 * jax.random.normal(getkey(), (n,))
    fn = lambda y, args: 0.5 * y @ (matrix @ y) - b @ y
    sol = eqxopt.minimize(
        fn, eqxopt.LBFGSB(), jnp.zeros(n), bounds=(-1.0, upper), rtol=0, atol=1e-9
    )
    ref = _scipy(fn, jnp.zeros(n), -1.0, upper)
    assert sol.result == eqxopt.RESULTS.successful
    assert np.allclose(sol.value, ref.x, atol=1e-7)
    at_bound = lambda x: (np.abs(x + 1) < 1e-9) | (np.abs(x - upper) < 1e-9)
    assert np.array_equal(at_bound(np.asarray(sol.value)), at_bound(ref.x))
    assert at_bound(np.asarray(sol.value)).sum() >= 5  # a real test of the active set
    assert int(sol.stats["num_fevals"]) <= 1.2 * ref.nfev + 2


_HS25_I = np.arange(1.0, 100.0)
_HS25_U = 25 + (-50 * np.log(0.01 * _HS25_I)) ** (2 / 3)


def hs25(y, args):
    """Hock & Schittkowski's problem 25: f* = 0 at (50, 25, 1.5)."""
    e = jnp.exp(-((_HS25_U - y[1]) ** y[2]) / y[0])
    return jnp.sum((-0.01 * _HS25_I + e) ** 2)


def test_first_step_rule_holds_on_the_first_iteration_only():
    # The first step is capped at unit length (scaled to length 1 / |d|) on the first
    # iteration only, as SciPy's (`iter == 0`), not whenever the L-BFGS memory is
    # empty. On HS25 every curvature pair is skipped: with the cap on every step,
    # LBFGSB stayed at the start (f = 32.8, 6 evaluations). The gradient there is
    # ~2e-8; SciPy (same tolerances) also stops at f = 32.835, after 2 evaluations.
    y0 = jnp.array([100.0, 12.5, 3.0])
    lower, upper = jnp.array([0.1, 0.0, 0.0]), jnp.array([100.0, 25.6, 5.0])
    sol = eqxopt.minimize(
        hs25, eqxopt.LBFGSB(), y0, bounds=(lower, upper), rtol=1e-10, atol=1e-10
    )
    ref = _scipy(hs25, y0, lower, upper)
    assert sol.result == eqxopt.RESULTS.successful
    assert float(sol.loss) < 1e-20 and float(sol.loss) <= ref.fun
    assert np.allclose(sol.value, [50.0, 25.0, 1.5], rtol=1e-6)


def test_hs45_takes_no_more_evaluations_than_scipy():
    # HS45: f = 2 - x1 x2 x3 x4 x5 / 120 on 0 <= x_i <= i; f* = 1 at the upper
    # bounds. SciPy: 10 evaluations (4 iterations); eqxopt 10 (23 while the
    # first-step rule held at every step with an empty memory).
    fn = lambda y, args: 2 - jnp.prod(y) / 120
    y0, upper = jnp.full(5, 2.0), jnp.arange(1.0, 6.0)
    sol = eqxopt.minimize(fn, eqxopt.LBFGSB(), y0, bounds=(0.0, upper), atol=1e-10)
    ref = _scipy(fn, y0, 0.0, upper)
    assert sol.result == eqxopt.RESULTS.successful
    assert np.allclose(sol.value, upper) and np.allclose(ref.x, upper)
    assert int(sol.stats["num_fevals"]) <= ref.nfev


def test_without_bounds_takes_the_same_steps_as_lbfgs():
    y = jnp.array([-1.2, 1.0, -0.5, 0.3])
    fn = lambda y: rosenbrock(y, None)
    opts = (eqxopt.LBFGS(memory_size=4), eqxopt.LBFGSB(memory_size=4))
    states = [o.init(y) for o in opts]
    ys = [y, y]

    @eqx.filter_jit
    def step(opt, y, state, **extra):
        value, grad = jax.value_and_grad(fn)(y)
        u, state = opt.update(grad, state, y, value=value, value_fn=fn, **extra)
        return eqx.apply_updates(y, u), state

    for _ in range(12):
        ys[0], states[0] = step(opts[0], ys[0], states[0])
        # Both sides open.
        ys[1], states[1] = step(opts[1], ys[1], states[1], bounds=(None, jnp.inf))
        # Rounding differs (two-loop recursion vs. compact form), nothing else.
        assert np.allclose(ys[0], ys[1], rtol=1e-9, atol=1e-12)
    assert float(fn(ys[0])) < 0.5 * float(fn(y))


def test_update_needs_its_extra_arguments():
    opt, y = eqxopt.LBFGSB(), jnp.zeros(2)
    state = opt.init(y)
    fn = lambda y: jnp.sum(y**2)
    for missing in ("value", "value_fn", "bounds"):
        extra = dict(value=fn(y), value_fn=fn, bounds=(0.0, 1.0))
        del extra[missing]
        with pytest.raises(ValueError, match=f"`{missing}="):
            opt.update(y, state, y, **extra)
    with pytest.raises(ValueError, match="memory_size"):
        eqxopt.LBFGSB(memory_size=0)


def test_every_evaluation_and_iterate_stays_in_the_box():
    # NaN outside [0, 2]^n: any evaluation outside the box would make the solve fail.
    def fn(y, args):
        inside = jnp.all((y >= 0) & (y <= 2))
        return jnp.where(inside, jnp.sum((y - args) ** 2) + jnp.sum(y**4), jnp.nan)

    target = jnp.array([-3.0, 1.0, 5.0])
    opts = [
        eqxopt.LBFGSB(),
        eqxopt.LBFGS(),
        eqxopt.Adam(0.1),  # pyright: ignore  (pyright misreads its signature)
        eqxopt.SGD(0.05),
    ]
    for opt in opts:
        sol = eqxopt.minimize(
            fn,
            opt,
            jnp.array([5.0, -1.0, 1.0]),
            target,
            bounds=(0.0, 2.0),
            atol=1e-6,
            rtol=0.0,
            max_steps=2000,
        )
        assert sol.result == eqxopt.RESULTS.successful, type(opt).__name__
        assert sol.value[0] == 0.0  # the projected gradient is zero at an active bound
        assert jnp.all((sol.value >= 0) & (sol.value <= 2))


@pytest.mark.parametrize("linesearch", [eqxopt.Zoom(), eqxopt.Backtracking()])
def test_projected_line_search_counts_each_evaluation_once(linesearch):
    # LBFGS as a projected method: its line search evaluates `fn` at the projection
    # of each trial point, and the step reuses that evaluation. Before, each
    # accepted point was evaluated again and `num_fevals` left out the line search's
    # calls: on HS1, 37 reported, 86 real, 36 of them repeats (Zoom; Backtracking:
    # 42, 97, 41); now 50 and 56, the same iterates up to rounding.
    points = []

    def fn(y, args):
        jax.debug.callback(lambda v: points.append(np.asarray(v)), y)
        return 100 * (y[1] - y[0] ** 2) ** 2 + (1 - y[0]) ** 2

    y0 = jnp.array([-2.0, 1.0])
    opt = eqxopt.LBFGS(linesearch=linesearch)
    hs1 = (jnp.array([-jnp.inf, -1.5]), jnp.inf)
    sol = eqxopt.minimize(fn, opt, y0, bounds=hs1, rtol=0.0, atol=1e-8)
    jax.effects_barrier()
    assert sol.result == eqxopt.RESULTS.successful
    assert np.allclose(sol.value, 1.0, atol=1e-6)
    assert int(sol.stats["num_fevals"]) == len(points)
    assert not any(np.array_equal(a, b) for a, b in zip(points, points[1:]))
    # A box that clips trial points (the solution is at y[0] = 0.5): the evaluations
    # there are at the projected points, and the count is still exact.
    points.clear()
    sol = eqxopt.minimize(fn, opt, y0, bounds=(-2.0, 0.5), max_steps=30, throw=False)
    jax.effects_barrier()
    assert any(p[0] == 0.5 for p in points) and np.all(np.asarray(points) <= 0.5)
    assert int(sol.stats["num_fevals"]) == len(points)
    assert not any(np.array_equal(a, b) for a, b in zip(points, points[1:]))


def test_bounds_prefixes_and_open_sides():
    y0 = {"a": jnp.zeros(3), "b": jnp.full(2, 4.0)}
    fn = lambda y, args: jnp.sum((y["a"] - 5.0) ** 2) + jnp.sum((y["b"] + 5.0) ** 2)
    bounds = ({"a": None, "b": 1.0}, {"a": jnp.array([1.0, jnp.inf, 2.0]), "b": None})
    sol = eqxopt.minimize(fn, eqxopt.LBFGSB(), y0, bounds=bounds)
    assert np.allclose(sol.value["a"], [1.0, 5.0, 2.0])
    assert np.allclose(sol.value["b"], [1.0, 1.0])


def test_bad_bounds():
    fn = lambda y, args: jnp.sum(y["w"] ** 2)
    y0 = {"w": jnp.zeros(2)}
    with pytest.raises(ValueError, match=r"lower > upper at \['w'\]"):
        eqxopt.minimize(fn, eqxopt.LBFGSB(), y0, bounds=({"w": 1.0}, {"w": 0.0}))
    with pytest.raises(ValueError, match="prefix"):
        eqxopt.minimize(fn, eqxopt.LBFGSB(), y0, bounds=({"v": 1.0}, None))
    with pytest.raises(ValueError, match="must be real, got a complex `upper`"):
        eqxopt.minimize(fn, eqxopt.LBFGSB(), y0, bounds=(0.0, {"w": 1j}))
    # NaN compares false with everything: unchecked, it would leave its side open.
    nan_upper = {"w": jnp.array([1.0, jnp.nan])}
    with pytest.raises(ValueError, match=r"a NaN `upper` bound at \['w'\]"):
        eqxopt.minimize(fn, eqxopt.LBFGSB(), y0, bounds=(0.0, nan_upper))
    # Traced bounds (here one box per lane, the first empty) are checked when the
    # solve runs (`eqx.error_if`: outside `eqx.filter_jit`, JAX reports the error).
    solve = lambda up: eqxopt.minimize(
        fn, eqxopt.LBFGSB(), y0, bounds=({"w": 1.0}, {"w": up})
    )
    errors = (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError)
    with pytest.raises(errors, match=r"lower > upper at \['w'\]"):
        jax.vmap(solve)(jnp.array([0.0, 2.0]))
    with pytest.raises(errors, match=r"a NaN bound at \['w'\]"):
        jax.vmap(solve)(jnp.array([2.0, jnp.nan]))
    assert np.allclose(jax.vmap(solve)(jnp.array([1.0, 2.0])).value["w"], 1.0)
    nan_start = lambda y, args: jnp.sum(y) * jnp.nan
    sol = eqxopt.minimize(
        nan_start, eqxopt.LBFGSB(), jnp.zeros(2), bounds=(0.0, 1.0), throw=False
    )
    assert sol.result == eqxopt.RESULTS.nonfinite


def _bounded_ridge(w, args):
    x, y = args
    return 0.5 * jnp.sum((x @ w - y) ** 2) + 0.05 * jnp.sum(w**2)


@pytest.mark.parametrize("adjoint", ["implicit", "unrolled"])
def test_derivative_with_active_bounds_matches_finite_differences(adjoint, getkey):
    x = jax.random.normal(getkey(), (30, 5))
    y = x @ jnp.array([2.0, -2.0, 0.3, 0.1, -0.2]) + 0.1 * jax.random.normal(
        getkey(), (30,)
    )
    c = jnp.arange(1.0, 6.0)

    def solve(y):
        return eqxopt.minimize(
            _bounded_ridge,
            eqxopt.LBFGSB(),
            jnp.zeros(5),
            (x, y),
            bounds=(-1.0, 1.0),
            rtol=0.0,
            atol=1e-12,
            adjoint=adjoint,
        ).value

    objective = lambda y: c @ solve(y)
    w = solve(y)
    assert jnp.sum(jnp.abs(w) == 1.0) == 2  # two active bounds
    grad = jax.grad(objective)(y)
    assert bool(jnp.all(jnp.isfinite(grad)))
    direction = jax.random.normal(getkey(), y.shape)
    h = 1e-5
    fd = (objective(y + h * direction) - objective(y - h * direction)) / (2 * h)
    assert np.isclose(grad @ direction, fd, rtol=1e-5, atol=1e-8)


def test_reverse_mode_at_tied_breakpoints_open_bounds_and_a_converged_lane():
    """Reverse mode through the unrolled solve, one `vmap` over four lanes of
    `(y - a)^2 + y^4` (per variable) with their own boxes:

    0. both variables reach their upper bound at the same point of the projected
       gradient path (tied breakpoints), and stay there: the solution does not move
       with `args` (it got derivatives 0.0625 and -0.0625, and NaN under `vmap`: the
       Cauchy point was `x - min(t, t_star) g`, whose derivatives cancel only without
       ties);
    1. one variable pinned at 0, one free;
    2. no bound (both sides infinite): the derivative was NaN (the largest feasible
       step, infinite, was divided by the step's scale);
    3. no bound, and `y0` is already the minimum: the lane stops at once while the
       others go on (its derivative was NaN: the norm of its zero step).
    """
    fn = lambda y, a: jnp.sum((y - a) ** 2) + jnp.sum(y**4)
    c = jnp.array([1.0, 2.0])

    def objective(a, lower, upper):  # loss(y*) + c . y*, and y*
        sol = eqxopt.minimize(
            fn, eqxopt.LBFGSB(), jnp.zeros(2), a, bounds=(lower, upper), rtol=0.0
        )
        return sol.loss + c @ sol.value, sol.value

    inf = jnp.inf
    a = jnp.array([[1.0, 1.0], [-3.0, 0.1], [1.0, 0.5], [0.0, 0.0]])
    lower = jnp.array([0.0, 0.0, -inf, -inf])
    upper = jnp.array([0.5, 0.5, inf, inf])
    grad, y = jax.vmap(jax.grad(objective, has_aux=True))(a, lower, upper)
    assert bool(jnp.all(jnp.isfinite(grad)))
    # Pinned at a bound, y* does not move: only d loss / da = 2 (a - y*) is left.
    assert np.array_equal(y[0], [0.5, 0.5])
    assert np.allclose(grad[0], 2 * (a[0] - 0.5), rtol=1e-12)
    assert y[1, 0] == 0.0 and grad[1, 0] == 2 * a[1, 0]
    # A free variable: (1 + 6 y^2) dy/da = 1 at its minimum (to the accuracy of a
    # derivative through finitely many steps: 1e-4 here).
    free = 2 * (a - y) + c / (1 + 6 * y**2)
    assert np.isclose(grad[1, 1], free[1, 1], rtol=1e-3)
    assert np.allclose(grad[2], free[2], rtol=1e-3)


def test_vmap_gives_each_lane_its_own_solution():
    def fn(y, args):
        return jnp.sum((y - args) ** 2) + jnp.where(args[0] > 10, jnp.nan, 0.0)

    y0 = jnp.array([[0.0, 0.0], [3.0, -3.0], [0.5, 0.5]])
    args = jnp.array([[1.0, 2.0], [20.0, 0.0], [-1.0, 0.25]])  # lane 1 is NaN
    uppers = jnp.array([10.0, 10.0, 0.0])

    def solve(y0, args, upper):
        return eqxopt.minimize(
            fn,
            eqxopt.LBFGSB(),
            y0,
            args,
            bounds=(-5.0, upper),
            throw=False,
            max_steps=50,
        )

    batched = jax.vmap(solve)(y0, args, uppers)
    ok = batched.result == eqxopt.RESULTS.successful
    assert np.array_equal(ok, [True, False, True])  # the NaN lane fails alone
    for i in range(3):
        single = solve(y0[i], args[i], uppers[i])
        lane = jax.tree.map(lambda x: x[i], batched)
        assert bool(lane.result == single.result)
        assert int(lane.stats["num_steps"]) == int(single.stats["num_steps"])
        assert np.allclose(lane.value, single.value, equal_nan=True)
        assert np.allclose(
            lane.stats["history"], single.stats["history"], equal_nan=True
        )
    results = [
        eqxopt.RESULTS[jax.tree.map(lambda x: x[i], batched.result)] for i in range(3)
    ]
    assert results[0] == "" and results[2] == "" and "nonfinite" in results[1]
    assert np.allclose(batched.value[2], [-1.0, 0.0])


def test_vmap_of_unbounded_lbfgs_over_y0():
    y0 = jnp.array([[-1.2, 1.0], [0.0, 0.0], [2.0, 2.0]])
    solve = lambda y0: eqxopt.minimize(rosenbrock, eqxopt.LBFGS(), y0, max_steps=300)
    batched = jax.vmap(solve)(y0)
    for i in range(3):
        single = solve(y0[i])
        assert int(batched.stats["num_steps"][i]) == int(single.stats["num_steps"])
        assert np.allclose(batched.value[i], single.value, rtol=1e-12)


def test_project_box_transform():
    params = {"w": jnp.array([0.2, 0.9, 0.5]), "b": jnp.array(3.0)}
    updates = {"w": jnp.array([-0.5, 0.5, 0.1]), "b": jnp.array(-10.0)}
    box = eqxopt.ProjectBox({"w": 0.0, "b": -1.0}, {"w": 1.0, "b": None})
    out, _ = box.update(updates, box.init(params), params)
    new = eqx.apply_updates(params, out)
    assert np.array_equal(new["w"], [0.0, 1.0, 0.6])
    assert new["b"] == -1.0
    with pytest.raises(ValueError, match="params"):
        box.update(updates, box.init(params))
    # A box that is empty only for some params is found at `update`, with the leaf.
    empty_w = eqxopt.ProjectBox({"w": 2.0, "b": 0.0}, 1.0)
    with pytest.raises(ValueError, match=r"lower > upper at \['w'\]"):
        empty_w.update(updates, empty_w.init(params), params)


@pytest.mark.parametrize(
    "lower, upper, message",
    [
        (1.0, 0.0, r"lower > upper \(1.0 > 0.0\)"),
        (jnp.nan, 1.0, "a NaN `lower` bound at the params"),
        (0.0, {"w": jnp.array([1.0, jnp.nan])}, r"a NaN `upper` bound at \['w'\]"),
        (0.0, 1j, "must be real, got a complex `upper` bound"),
        ("0", 1.0, "must be real, got a <U1 `lower` bound"),
    ],
)
def test_project_box_checks_its_bounds_at_construction(lower, upper, message):
    with pytest.raises(ValueError, match=message):
        eqxopt.ProjectBox(lower, upper)


def test_minimize_without_bounds_solves_like_lbfgs():
    """design.md: `minimize` passes `LBFGSB` its bounds; given none, both sides are open
    and it takes `LBFGS`'s steps (its `update` alone still requires `bounds=`)."""
    y0 = jnp.array([-1.2, 1.0, -0.5, 0.3])
    solve = lambda opt: eqxopt.minimize(rosenbrock, opt, y0, rtol=0.0, atol=1e-9)
    bounded, plain = solve(eqxopt.LBFGSB()), solve(eqxopt.LBFGS())
    assert bounded.result == eqxopt.RESULTS.successful
    assert np.allclose(bounded.value, plain.value, rtol=1e-9)
    # Rounding differs (compact form vs. two-loop recursion): steps within one or two.
    assert abs(int(bounded.stats["num_steps"]) - int(plain.stats["num_steps"])) <= 2
