"""`eqxopt.least_squares` and `eqxopt.curve_fit` (API.md section 9), with SciPy run
in-process as the reference (x64 from the suite's conftest)."""

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so
from jax.flatten_util import ravel_pytree
from scipy.optimize._lsq.common import find_active_constraints

import eqxopt


def _scipy(fn, x0, method, **kw):
    """SciPy's `least_squares` on `fn(y, None)` with its exact Jacobian."""
    f = jax.jit(lambda x: fn(x, None))
    J = jax.jit(jax.jacfwd(lambda x: fn(x, None)))
    jac: Any = lambda x: np.asarray(J(jnp.asarray(x)))
    return so.least_squares(
        lambda x: np.asarray(f(jnp.asarray(x))),
        np.asarray(x0, float),
        jac=jac,
        method=method,
        **kw,
    )


# Moré, Garbow and Hillstrom (1981), "Testing unconstrained optimization software",
# from the paper's starting points.
def rosenbrock(x, _):
    return jnp.stack([10 * (x[1] - x[0] ** 2), 1 - x[0]])


def freudenstein_roth(x, _):
    return jnp.stack(
        [
            -13 + x[0] + ((5 - x[1]) * x[1] - 2) * x[1],
            -29 + x[0] + ((x[1] + 1) * x[1] - 14) * x[1],
        ]
    )


def powell_badly_scaled(x, _):
    return jnp.stack([1e4 * x[0] * x[1] - 1, jnp.exp(-x[0]) + jnp.exp(-x[1]) - 1.0001])


def brown_badly_scaled(x, _):
    return jnp.stack([x[0] - 1e6, x[1] - 2e-6, x[0] * x[1] - 2])


def beale(x, _):
    y = jnp.array([1.5, 2.25, 2.625])
    i = jnp.arange(1.0, 4.0)
    return y - x[0] * (1 - x[1] ** i)


def jennrich_sampson(x, _):
    i = jnp.arange(1.0, 11.0)
    return 2 + 2 * i - (jnp.exp(i * x[0]) + jnp.exp(i * x[1]))


def helical_valley(x, _):
    theta = jnp.arctan(x[1] / x[0]) / (2 * jnp.pi) + jnp.where(x[0] < 0, 0.5, 0.0)
    return jnp.stack(
        [10 * (x[2] - 10 * theta), 10 * (jnp.sqrt(x[0] ** 2 + x[1] ** 2) - 1), x[2]]
    )


_BARD_Y = np.array(
    [0.14, 0.18, 0.22, 0.25, 0.29, 0.32, 0.35, 0.39, 0.37, 0.58, 0.73, 0.96, 1.34]
    + [2.10, 4.39]
)


def bard(x, _):
    u = jnp.arange(1.0, 16.0)
    v = 16 - u
    w = jnp.minimum(u, v)
    return _BARD_Y - (x[0] + u / (v * x[1] + w * x[2]))


def box_3d(x, _):
    t = 0.1 * jnp.arange(1.0, 11.0)
    return (
        jnp.exp(-t * x[0])
        - jnp.exp(-t * x[1])
        - x[2] * (jnp.exp(-t) - jnp.exp(-10 * t))
    )


def powell_singular(x, _):
    return jnp.stack(
        [
            x[0] + 10 * x[1],
            math.sqrt(5) * (x[2] - x[3]),
            (x[1] - 2 * x[2]) ** 2,
            math.sqrt(10) * (x[0] - x[3]) ** 2,
        ]
    )


_MEYER_Y = np.array(
    [34780, 28610, 23650, 19630, 16370, 13720, 11540, 9744, 8261, 7030, 6005, 5147]
    + [4427, 3820, 3307, 2872],
    float,
)


def meyer(x, _):
    t = 45 + 5 * jnp.arange(1.0, 17.0)
    return x[0] * jnp.exp(x[1] / (t + x[2])) - _MEYER_Y


MGH = [
    (rosenbrock, [-1.2, 1.0]),
    (freudenstein_roth, [0.5, -2.0]),
    (powell_badly_scaled, [0.0, 1.0]),
    (brown_badly_scaled, [1.0, 1.0]),
    (beale, [1.0, 1.0]),
    (jennrich_sampson, [0.3, 0.4]),
    (helical_valley, [-1.0, 0.0, 0.0]),
    (bard, [1.0, 1.0, 1.0]),
    (box_3d, [0.0, 10.0, 20.0]),
    (powell_singular, [3.0, -1.0, 0.0, 1.0]),
    (meyer, [0.02, 4000.0, 250.0]),
]


def _cost_ok(cost, ref):
    return cost <= ref * (1 + 1e-6) + 1e-14


@pytest.mark.parametrize(
    "solver, method",
    [
        (eqxopt.TrustRegionReflective(), "trf"),
        (eqxopt.LevenbergMarquardt(), "lm"),
    ],
    ids=["trf", "lm"],
)
def test_mgh_problems_match_or_beat_scipy(solver, method):
    ratios = []
    for fn, x0 in MGH:
        kw: dict[str, Any] = dict(max_nfev=10_000)
        if method == "lm":
            kw["x_scale"] = 1.0  # eqxopt's default (SciPy >= 1.16: "jac" for lm)
        ref = _scipy(fn, x0, method, **kw)
        sol = eqxopt.least_squares(
            fn, solver, jnp.asarray(x0), max_steps=2000, throw=False
        )
        assert sol.result == eqxopt.RESULTS.successful, fn.__name__
        assert _cost_ok(float(sol.loss), ref.cost), (fn.__name__, sol.loss, ref.cost)
        np.testing.assert_allclose(
            np.asarray(sol.residuals), ref.fun, rtol=1e-5, atol=1e-7
        )
        ratios.append(int(sol.stats["num_fevals"]) / ref.nfev)
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    # LM: SciPy's count on 10 of the 11; on Powell singular (a singular Jacobian at
    # the solution) MINPACK's gtol test, through its pivoted QR, stops at a cost of
    # 9e-46 after 40 evaluations, ours at 7e-59 after 54 (geometric mean 1.03).
    assert geomean <= (1.0 if method == "trf" else 1.035), ratios


def test_trf_x_scale_jac_matches_scipy():
    for fn, x0 in MGH[:4]:
        ref = _scipy(fn, x0, "trf", x_scale="jac")
        solver = eqxopt.TrustRegionReflective(x_scale="jac")
        sol = eqxopt.least_squares(fn, solver, jnp.asarray(x0), throw=False)
        assert _cost_ok(float(sol.loss), ref.cost), fn.__name__
        assert int(sol.stats["num_fevals"]) <= ref.nfev, fn.__name__


# Bounded fits: the same cost and active set as SciPy's trf.
_T = np.linspace(0.0, 4.0, 25)
_DECAY = 2.0 * np.exp(0.3 * _T) + 0.05 * np.sin(7 * _T)  # grows: the rate hits 0
_S = np.array([0.02, 0.02, 0.06, 0.06, 0.11, 0.11, 0.22, 0.22, 0.56, 0.56, 1.1, 1.1])
_V = np.array([76, 47, 97, 107, 123, 139, 159, 152, 191, 201, 207, 200], float)


def decay(x, _):
    return x[0] * jnp.exp(-x[1] * _T) - _DECAY


def michaelis_menten(x, _):
    return x[0] * _S / (x[1] + _S) - _V


BOUNDED = [
    (decay, [1.0, 1.0], ([0.0, 0.0], [np.inf, np.inf])),
    (rosenbrock, [-1.2, 1.0], ([-np.inf, -np.inf], [0.5, np.inf])),
    (michaelis_menten, [100.0, 0.5], ([0.0, 0.0], [200.0, 1.0])),
]


@pytest.mark.parametrize(
    "fn, x0, bounds", BOUNDED, ids=lambda v: getattr(v, "__name__", "")
)
def test_bounded_fits_match_scipy_trf(fn, x0, bounds):
    ref = _scipy(fn, x0, "trf", bounds=bounds)
    lower, upper = (jnp.asarray(b) for b in bounds)
    sol = eqxopt.least_squares(fn, None, jnp.asarray(x0), bounds=(lower, upper))
    assert _cost_ok(float(sol.loss), ref.cost), (sol.loss, ref.cost)
    active = find_active_constraints(
        np.asarray(sol.value), *map(np.asarray, bounds), rtol=1e-8
    )
    np.testing.assert_array_equal(active, ref.active_mask)
    assert np.any(active != 0)  # each problem has an active bound
    np.testing.assert_allclose(sol.value, ref.x, rtol=1e-6, atol=1e-9)
    assert int(sol.stats["num_fevals"]) <= ref.nfev
    assert np.all(sol.value >= lower) and np.all(sol.value <= upper)


def test_pytree_params_residuals_aux_and_solution_fields():
    t = jnp.linspace(0.0, 2.0, 8)

    def fn(y, args):
        r = {"a": y["amp"] * jnp.exp(-y["k"] * t) - args, "b": y["k"][None] - 1.0}
        return r, {"n": jnp.sum(t)}

    y0 = {"amp": jnp.array(1.0), "k": jnp.array(0.3)}
    data = 2.0 * jnp.exp(-t)
    sol = eqxopt.least_squares(fn, None, y0, data, has_aux=True)
    np.testing.assert_allclose(sol.value["amp"], 2.0, rtol=1e-6)
    np.testing.assert_allclose(sol.value["k"], 1.0, rtol=1e-6)
    assert (
        sol.residuals is not None
        and set(sol.residuals) == {"a", "b"}
        and sol.aux["n"].shape == ()
    )
    J = jax.jacfwd(lambda x: ravel_pytree(fn(x, data)[0])[0])(sol.value)
    Jflat = np.concatenate(
        [np.asarray(J["amp"])[:, None], np.asarray(J["k"])[:, None]], 1
    )
    assert sol.jac is not None and sol.jac.shape == (9, 2)
    np.testing.assert_allclose(np.asarray(sol.jac), Jflat, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(sol.loss, 0.0, atol=1e-20)
    assert {"num_steps", "num_fevals", "num_jevals", "history"} <= set(sol.stats)
    # a matrix-free solve reaches the same point, without a Jacobian
    mf = eqxopt.least_squares(
        fn, eqxopt.TrustRegionReflective(jac="matrix-free"), y0, data, has_aux=True
    )
    assert mf.jac is None
    np.testing.assert_allclose(mf.value["k"], 1.0, rtol=1e-6)


@pytest.mark.parametrize(
    "fn, x0",
    [
        (rosenbrock, [-1.2, 1.0]),
        (brown_badly_scaled, [1.0, 1.0]),
        (beale, [1.0, 1.0]),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_lm_matrix_free_matches_dense(fn, x0):
    x0 = jnp.asarray(x0)
    dense = eqxopt.least_squares(fn, eqxopt.LevenbergMarquardt(), x0)
    mf = eqxopt.least_squares(fn, eqxopt.LevenbergMarquardt(jac="matrix-free"), x0)
    assert mf.jac is None
    np.testing.assert_allclose(mf.value, dense.value, rtol=1e-7, atol=1e-9)
    assert _cost_ok(float(mf.loss), float(dense.loss))
    # the same MINPACK iteration; CG's inexact steps may cost an evaluation or two
    assert abs(int(mf.stats["num_fevals"]) - int(dense.stats["num_fevals"])) <= 2


def test_lm_matrix_free_pytree_fit():
    t = jnp.linspace(0.0, 3.0, 15)
    data = 2.0 * jnp.exp(-0.7 * t) + 0.3 + 0.01 * jnp.sin(5 * t)

    def fn(y, data):
        return {"r": y["a"] * jnp.exp(-y["k"] * t) + y["c"] - data}

    y0 = {"a": jnp.array(1.0), "k": jnp.array(1.0), "c": jnp.array(0.0)}
    dense = eqxopt.least_squares(fn, eqxopt.LevenbergMarquardt(), y0, data)
    solver = eqxopt.LevenbergMarquardt(jac="matrix-free", x_scale=2.0)
    mf = eqxopt.least_squares(fn, solver, y0, data)
    for k in y0:
        np.testing.assert_allclose(mf.value[k], dense.value[k], rtol=1e-7)
    with pytest.raises(ValueError, match="matrix-free"):
        eqxopt.LevenbergMarquardt(jac="matrix-free", x_scale="jac")
    with pytest.raises(ValueError, match="matrix-free"):
        eqxopt.TrustRegionReflective(jac="matrix-free", x_scale="jac")


@pytest.mark.parametrize("solver", ["TrustRegionReflective", "LevenbergMarquardt"])
def test_matrix_free_solve_holds_no_jacobian(solver):
    """A matrix-free fit of 20,000 residuals in 2,000 params (a dense Jacobian of
    320 MB) compiles to a program whose temporaries are a few residual- and
    param-sized vectors, not the Jacobian, and reaches the curve
    (benchmarks/least_squares.py runs 10^6 x 10^4: about 160 MB against 80 GB)."""
    m, n = 20_000, 2_000
    t, knots = jnp.linspace(0.0, 1.0, m), jnp.linspace(0.0, 1.0, n)
    data = jnp.exp(jnp.sin(6 * t))

    def res(y, data):
        return jnp.exp(jnp.interp(t, knots, y)) - data

    method = getattr(eqxopt, solver)(jac="matrix-free")
    solve = jax.jit(lambda y0: eqxopt.least_squares(res, method, y0, data))
    compiled = solve.lower(jnp.zeros(n)).compile()
    memory = compiled.memory_analysis()
    assert memory is not None
    temporaries = memory.temp_size_in_bytes
    assert temporaries < 50 * (m + n) * 8 < m * n * 8 / 10, temporaries
    if solver == "TrustRegionReflective":  # (LM's CG steps take 40 s to converge)
        sol = compiled(jnp.zeros(n))
        assert sol.result == eqxopt.RESULTS.successful
        assert float(jnp.max(jnp.abs(sol.value - jnp.sin(6 * knots)))) < 1e-3


def test_vmap_lanes_equal_single_solves():
    data = jnp.stack([2.0 * jnp.exp(-k * jnp.asarray(_T)) for k in (0.5, 1.0, 3.0)])
    data = data.at[2, 0].set(jnp.nan)  # a failing lane leaves the others alone

    def fn(x, d):
        return x[0] * jnp.exp(-x[1] * _T) - d

    def solve(d):
        return eqxopt.least_squares(fn, None, jnp.array([1.0, 1.0]), d, throw=False)

    batched = jax.vmap(solve)(data)
    for i in range(3):
        single = solve(data[i])
        np.testing.assert_allclose(batched.value[i], single.value, rtol=1e-12)
        assert (batched.result == single.result)[i]
        for k in ("num_steps", "num_fevals", "num_jevals"):
            assert batched.stats[k][i] == single.stats[k]
    assert (batched.result == eqxopt.RESULTS.nonfinite)[2]
    assert (batched.result == eqxopt.RESULTS.successful)[0]


@pytest.mark.parametrize("adjoint", ["implicit", "unrolled"])
@pytest.mark.parametrize(
    "solver",
    [eqxopt.TrustRegionReflective(), eqxopt.LevenbergMarquardt()],
    ids=["trf", "lm"],
)
def test_derivative_of_a_linear_fit_is_the_normal_equations(solver, adjoint):
    t = jnp.linspace(0.0, 1.0, 10)
    A = jnp.stack([jnp.ones_like(t), t, t**2], 1)

    def fn(y, data):
        return A @ y - data

    def fit(data):
        return eqxopt.least_squares(
            fn, solver, jnp.zeros(3), data, adjoint=adjoint
        ).value

    data = jnp.sin(3 * t)
    expected = jnp.linalg.solve(A.T @ A, A.T)
    np.testing.assert_allclose(jax.jacrev(fit)(data), expected, atol=1e-9)
    if adjoint == "implicit":  # the unrolled loop is reverse-mode only
        np.testing.assert_allclose(jax.jacfwd(fit)(data), expected, atol=1e-9)


@pytest.mark.parametrize(
    "solver, bounds",
    [
        (eqxopt.TrustRegionReflective(), None),
        (eqxopt.TrustRegionReflective(), ((0.0, 0.0, -1.0), (10.0, 10.0, 1.0))),
        (eqxopt.LevenbergMarquardt(), None),
    ],
    ids=["trf", "trf-bounds", "lm"],
)
def test_unrolled_derivative_of_a_nonlinear_fit_matches_finite_differences(
    solver, bounds
):
    t = jnp.linspace(0.0, 3.0, 15)

    def fn(y, data):
        return y[0] * jnp.exp(-y[1] * t) + y[2] - data

    def fit(data, adjoint):
        lu = (
            None if bounds is None else (jnp.asarray(bounds[0]), jnp.asarray(bounds[1]))
        )
        sol = eqxopt.least_squares(
            fn, solver, jnp.array([1.0, 1.0, 0.0]), data, bounds=lu, adjoint=adjoint
        )
        return sol.value

    data = 2.0 * jnp.exp(-0.7 * t) + 0.3 + 0.01 * jnp.sin(5 * t)
    unrolled = jax.jacrev(lambda d: fit(d, "unrolled"))(data)
    assert np.all(np.isfinite(unrolled))
    # Central differences of the (converged) solution map; h balances truncation
    # against the solver's tolerances (1e-8 on the step and cost).
    h = 1e-5
    eye = jnp.eye(t.size)
    fd = jnp.stack(
        [
            (fit(data + h * e, "implicit") - fit(data - h * e, "implicit")) / (2 * h)
            for e in eye
        ],
        axis=1,
    )
    np.testing.assert_allclose(unrolled, fd, rtol=1e-4, atol=1e-5)
    implicit = jax.jacrev(lambda d: fit(d, "implicit"))(data)
    np.testing.assert_allclose(unrolled, implicit, rtol=1e-4, atol=1e-6)


def _model(x, p):
    return p["a"] * jnp.exp(-p["k"] * x) + p["c"]


def _np_model(x, a, k, c):
    return a * np.exp(-k * x) + c


_X = np.linspace(0.0, 5.0, 40)
_Y = _np_model(_X, 2.5, 1.3, 0.5) + 0.05 * np.random.default_rng(0).normal(size=40)
_P0 = {"a": 1.0, "c": 0.0, "k": 1.0}  # ravel order: a, c, k
_SIG = 0.02 + 0.05 * _X / 5


def _popt_vec(p):
    return np.array([p["a"], p["c"], p["k"]])


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"sigma": _SIG},
        {"sigma": _SIG, "absolute_sigma": True},
        {"bounds": ([0, 0, 0], [2.0, 1.0, 3.0])},
    ],
    ids=["plain", "sigma", "absolute_sigma", "bounds"],
)
def test_curve_fit_matches_scipy(kw):
    ref_kw = dict(kw)
    bounds = kw.get("bounds")
    ours_kw = dict(kw)
    if bounds is not None:
        # SciPy's order (a, k, c) against ours (a, c, k)
        ref_kw["bounds"] = ([0, 0, 0], [2.0, 3.0, 1.0])
        ours_kw["bounds"] = (0.0, {"a": 2.0, "c": 1.0, "k": 3.0})
    popt_ref, pcov_ref = so.curve_fit(_np_model, _X, _Y, p0=[1.0, 1.0, 0.0], **ref_kw)
    perm = [0, 2, 1]
    popt_ref, pcov_ref = popt_ref[perm], pcov_ref[np.ix_(perm, perm)]
    p0 = {k: jnp.asarray(v) for k, v in _P0.items()}
    popt, pcov = eqxopt.curve_fit(
        _model, jnp.asarray(_X), jnp.asarray(_Y), p0, **ours_kw
    )
    np.testing.assert_allclose(_popt_vec(popt), popt_ref, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(pcov, pcov_ref, rtol=1e-4, atol=1e-12)


def test_curve_fit_rank_deficient_gives_inf_pcov_as_scipy():
    def f(x, p):
        return p[0] * x + 0.0 * p[1]

    with pytest.warns(so.OptimizeWarning):
        _, pcov_ref = so.curve_fit(lambda x, a, b: a * x + 0.0 * b, _X, 2 * _X + 0.1)
    popt, pcov = eqxopt.curve_fit(
        f, jnp.asarray(_X), jnp.asarray(2 * _X + 0.1), jnp.ones(2)
    )
    assert np.all(np.isinf(pcov_ref)) and np.all(np.isinf(pcov))


def test_curve_fit_under_jit_and_vmap():
    ys = jnp.stack([jnp.asarray(_Y), jnp.asarray(_Y) * 2])
    p0 = {k: jnp.asarray(v) for k, v in _P0.items()}
    fit = jax.jit(jax.vmap(lambda y: eqxopt.curve_fit(_model, jnp.asarray(_X), y, p0)))
    popt, pcov = fit(ys)
    single, _ = eqxopt.curve_fit(_model, jnp.asarray(_X), ys[1], p0)
    np.testing.assert_allclose(popt["a"][1], single["a"], rtol=1e-10)
    assert pcov.shape == (2, 3, 3)


def test_bad_input():
    y0 = jnp.zeros(2)
    with pytest.raises(ValueError, match="PyTree of arrays"):
        eqxopt.least_squares(lambda y, a: {"r": "abc"}, None, y0)
    with pytest.raises(ValueError, match="scalar"):
        eqxopt.least_squares(lambda y, a: jnp.sum(y**2), None, y0)
    with pytest.raises(ValueError, match="lower > upper"):
        eqxopt.least_squares(rosenbrock, None, y0, bounds=(1.0, 0.0))
    with pytest.raises(ValueError, match="bounds"):
        eqxopt.least_squares(
            rosenbrock, eqxopt.LevenbergMarquardt(), y0, bounds=(0.0, 1.0)
        )
    with pytest.raises(ValueError, match="jac"):
        eqxopt.TrustRegionReflective(jac="central")
    with pytest.raises(ValueError, match="jac"):
        eqxopt.LevenbergMarquardt(jac="2-point")


def test_nonfinite_residuals():
    def fn(y, _):
        return jnp.stack([jnp.log(y[0] - 1.0), y[1]])  # NaN at y0

    sol = eqxopt.least_squares(fn, None, jnp.zeros(2), throw=False)
    assert sol.result == eqxopt.RESULTS.nonfinite
    with pytest.raises(eqx.EquinoxRuntimeError, match="nonfinite"):
        eqxopt.least_squares(fn, None, jnp.zeros(2))
    # under `jit` too the message names `least_squares`, not `minimize`
    with pytest.raises(Exception, match="eqxopt.least_squares: `RESULTS.nonfinite`"):
        jax.jit(lambda y: eqxopt.least_squares(fn, None, y).value)(jnp.zeros(2))
