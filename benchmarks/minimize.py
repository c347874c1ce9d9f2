"""Full-batch minimisation benchmark: eqxopt L-BFGS and L-BFGS-B against scipy,
Optax, optimistix (and jaxopt, when installed) on fixed float64 test sets.

Three sections, all run by default (`--unbounded`, `--bounded`, `--vmap` pick some):

- unbounded: `eqxopt.LBFGS` against scipy's L-BFGS-B, Optax's `lbfgs`, optimistix's
  `LBFGS` and `BFGS` and jaxopt's `LBFGS`, on nine classic problems;
- bounded: `eqxopt.LBFGSB` (`minimize(..., bounds=...)`) against scipy's L-BFGS-B and
  jaxopt's `LBFGSB`, on bound-constrained problems with active bounds at the solution
  (Rosenbrock, extended Powell, Beale, a decay fit, non-negative least squares, a
  logistic regression with boxed weights, a 10,000-variable denoising problem). Per
  problem it checks that eqxopt finds scipy's solution (loss to 1e-8, point to 1e-3,
  relative) with the same active set, and reports the ratios of evaluations (to
  scipy) and of compiled run time (to jaxopt), with their geometric means;
- vmap: 64 random starts of a multimodal problem (Styblinski-Tang in a box) solved by
  one `jax.vmap(minimize)` against a Python loop of single compiled solves: time per
  lane.

For each problem and solver it reports whether the solver converged (final
`max|grad| <= 10 * GTOL * max(1, |f|)`, the projected gradient with bounds), the number
of function(+gradient) evaluations, the median wall time of a compiled run (the
solvers' runs interleaved, so that all of them see the same load), and the first call
including compilation.

    python benchmarks/minimize.py [--quick] [--repeats N] [--only NAME,...]
        [--unbounded] [--bounded] [--vmap] [--first-call]

`--first-call` (not part of the default run) measures only first calls, in wall time
and in CPU time: eqxopt's `minimize(fn, LBFGS(), y0)` against Optax's lbfgs loop on
the unbounded set, each time with a new function object, `--repeats` times per
problem (default 3), and prints the medians of the per-problem ratios.

`--quick` (CI-sized smoke run) solves Rosenbrock 2 and the decay fit with eqxopt,
scipy and Optax, the bounded NNLS problem, and 8 starts in the vmap section, twice
each. Every solver is asked to stop at
`max|grad| <= GTOL` (the projected gradient with bounds; or its closest criterion)
within the same `max_steps`.
"""

import argparse
import functools as ft
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax


jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import optimistix as optx
import scipy.optimize

import eqxopt


try:  # jaxopt is deprecated upstream and optional here
    import jaxopt  # pyright: ignore[reportMissingImports]
except ImportError:  # pragma: no cover
    jaxopt = None

GTOL = 1e-6


# --- the test set (every function is `fn(y, args) -> scalar`, float64) ---------------


def rosenbrock(y, args):
    return jnp.sum(100.0 * (y[1:] - y[:-1] ** 2) ** 2 + (1.0 - y[:-1]) ** 2)


def extended_powell(y, args):
    a, b, c, d = y[0::4], y[1::4], y[2::4], y[3::4]
    return jnp.sum(
        (a + 10 * b) ** 2 + 5 * (c - d) ** 2 + (b - 2 * c) ** 4 + 10 * (a - d) ** 4
    )


def quadratic(y, args):
    matrix, b = args
    return 0.5 * y @ (matrix @ y) - b @ y


def logistic(w, args):
    x, labels, reg = args
    logits = x @ w[:-1] + w[-1]
    return jnp.mean(jnp.logaddexp(0.0, logits) - labels * logits) + reg * jnp.sum(
        w[:-1] ** 2
    )


def beale(y, args):
    a, b = y[0], y[1]
    return (
        (1.5 - a + a * b) ** 2
        + (2.25 - a + a * b**2) ** 2
        + (2.625 - a + a * b**3) ** 2
    )


def decay_fit(p, args):
    """Least squares fit of `a exp(-k t) + c` to noisy samples."""
    t, data = args
    a, k, c = p
    return 0.5 * jnp.sum((a * jnp.exp(-k * t) + c - data) ** 2)


class Problem(NamedTuple):
    name: str
    fn: Callable
    y0: Any
    args: Any
    max_steps: int
    bounds: Any = None  # `(lower, upper)`, arrays shaped like `y0` (+-inf: open)


def _keys():
    return jr.split(jr.key(0), 4)


def _rosenbrock(size: int, max_steps: int) -> Problem:
    y0 = jnp.tile(jnp.array([-1.2, 1.0]), size // 2)
    return Problem(f"rosenbrock_{size}", rosenbrock, y0, None, max_steps)


def _quadratic(n: int = 100) -> Problem:
    k1, k2, _, _ = _keys()
    q, _ = jnp.linalg.qr(jr.normal(k1, (n, n)))
    matrix = (q * jnp.logspace(0, 4, n)) @ q.T
    matrix = 0.5 * (matrix + matrix.T)
    b = jr.normal(k2, (n,))
    return Problem("quadratic_cond1e4", quadratic, jnp.ones(n), (matrix, b), 2000)


def _logistic() -> Problem:
    _, _, k3, k4 = _keys()
    x = jr.normal(k3, (500, 20))
    w_true = jnp.linspace(-1, 1, 20)
    labels = (x @ w_true + 0.5 * jr.normal(k4, (500,)) > 0).astype(jnp.float64)
    return Problem("logistic_500x20", logistic, jnp.zeros(21), (x, labels, 1e-3), 1000)


def _decay_fit() -> Problem:
    t = jnp.linspace(0, 4, 50)
    data = 2.0 * jnp.exp(-1.3 * t) + 0.5 + 0.01 * jnp.sin(37.0 * t)
    return Problem("decay_fit", decay_fit, jnp.array([1.0, 1.0, 0.0]), (t, data), 1000)


# The unbounded set, by name: each problem's data is built only when it is asked for.
_UNBOUNDED: dict[str, Callable[[], Problem]] = {
    "rosenbrock_2": lambda: _rosenbrock(2, 1000),
    "rosenbrock_10": lambda: _rosenbrock(10, 1000),
    "rosenbrock_100": lambda: _rosenbrock(100, 2000),
    "rosenbrock_1000": lambda: _rosenbrock(1000, 10_000),
    "extended_powell_100": lambda: Problem(
        "extended_powell_100",
        extended_powell,
        jnp.tile(jnp.array([3.0, -1.0, 0.0, 1.0]), 25),
        None,
        1000,
    ),
    "quadratic_cond1e4": _quadratic,
    "logistic_500x20": _logistic,
    "beale": lambda: Problem("beale", beale, jnp.array([1.0, 1.0]), None, 1000),
    "decay_fit": _decay_fit,
}
UNBOUNDED = tuple(_UNBOUNDED)


def _problems(quick: bool, names: Sequence[str] | None = None) -> list[Problem]:
    """The unbounded set (`--quick`: two of it), or the problems named in `names`."""
    if names is None:
        names = ("rosenbrock_2", "decay_fit") if quick else UNBOUNDED
    return [_UNBOUNDED[name]() for name in names]


# --- solvers: each `solve(problem) -> (y, num_fevals)`, jitted where it applies ------


def solve_eqxopt(p: Problem):
    sol = eqxopt.minimize(
        p.fn,
        eqxopt.LBFGS(),
        p.y0,
        p.args,
        max_steps=p.max_steps,
        rtol=0.0,
        atol=GTOL,
        throw=False,
    )
    return sol.value, sol.stats["num_fevals"]


def _optax_loop(fn, y0, args, max_steps):
    opt = optax.lbfgs()
    loss = ft.partial(fn, args=args)
    value_and_grad = optax.value_and_grad_from_state(loss)

    def cond(carry):
        y, state, k, evals = carry
        grad = optax.tree.get(state, "grad")
        return (k == 0) | ((k < max_steps) & (jnp.max(jnp.abs(grad)) > GTOL))

    def body(carry):
        y, state, k, evals = carry
        value, grad = value_and_grad(y, state=state)
        updates, state = opt.update(
            grad, state, y, value=value, grad=grad, value_fn=loss
        )
        info = optax.tree.get(state, "info")
        return (
            optax.apply_updates(y, updates),
            state,
            k + 1,
            evals + info.num_linesearch_steps,
        )

    y, _, _, evals = jax.lax.while_loop(cond, body, (y0, opt.init(y0), 0, 1))
    return y, evals


def solve_optax(p: Problem):
    return jax.jit(_optax_loop, static_argnums=(0, 3))(p.fn, p.y0, p.args, p.max_steps)


def _optimistix(solver, fn, y0, args, max_steps):
    sol = optx.minimise(fn, solver, y0, args, max_steps=max_steps, throw=False)
    # One function-and-gradient evaluation per step, plus the one at y0.
    return sol.value, sol.stats["num_steps"] + 1


def solve_optx_lbfgs(p: Problem):
    solver = optx.LBFGS(rtol=1e-10, atol=1e-10)
    return jax.jit(_optimistix, static_argnums=(0, 1, 4))(
        solver, p.fn, p.y0, p.args, p.max_steps
    )


def solve_optx_bfgs(p: Problem):
    solver = optx.BFGS(rtol=1e-10, atol=1e-10)
    return jax.jit(_optimistix, static_argnums=(0, 1, 4))(
        solver, p.fn, p.y0, p.args, p.max_steps
    )


def _jaxopt(fn, y0, args, max_steps):
    solver = jaxopt.LBFGS(fun=fn, maxiter=max_steps, tol=GTOL)  # pyright: ignore
    y, state = solver.run(y0, args)
    return y, state.num_fun_eval


def solve_jaxopt(p: Problem):
    return jax.jit(_jaxopt, static_argnums=(0, 3))(p.fn, p.y0, p.args, p.max_steps)


_scipy_cache: dict = {}


def solve_scipy(p: Problem):
    key = (p.fn, p.y0.shape)
    if key not in _scipy_cache:
        _scipy_cache[key] = jax.jit(jax.value_and_grad(p.fn))
    value_and_grad = _scipy_cache[key]

    def fun(y):
        v, g = value_and_grad(jnp.asarray(y), p.args)
        return float(v), np.asarray(g)

    bounds = None
    if p.bounds is not None:
        bounds = list(zip(*(np.asarray(b).tolist() for b in p.bounds)))
    res = scipy.optimize.minimize(
        fun,
        np.asarray(p.y0),
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": p.max_steps, "gtol": GTOL, "ftol": 1e-15, "maxfun": 10**6},
    )
    return jnp.asarray(res.x), res.nfev


SOLVERS = {
    "eqxopt LBFGS": solve_eqxopt,
    "scipy L-BFGS-B": solve_scipy,
    "optax lbfgs": solve_optax,
    "optimistix LBFGS": solve_optx_lbfgs,
    "optimistix BFGS": solve_optx_bfgs,
}
if jaxopt is not None:
    SOLVERS["jaxopt LBFGS"] = solve_jaxopt


# --- the bounded set: box constraints active at the solution -----------------------


def nnls(x, args):
    """Non-negative least squares `0.5 |A x - b|^2`, `x >= 0`."""
    matrix, b = args
    return 0.5 * jnp.sum((matrix @ x - b) ** 2)


def denoise(x, args):
    """A signal in [0, 1] denoised with a smoothed total-variation penalty."""
    data, lam, eps = args
    jumps = jnp.sqrt((x[1:] - x[:-1]) ** 2 + eps**2)
    return 0.5 * jnp.sum((x - data) ** 2) + lam * jnp.sum(jumps)


def styblinski_tang(y, args):
    """Multimodal: 2^d local minima in the box [-5, 5]^d, the global one at
    y_i = -2.9035."""
    return 0.5 * jnp.sum(y**4 - 16 * y**2 + 5 * y)


def _box(y0, lower, upper):
    shape, dtype = y0.shape, y0.dtype
    return (
        jnp.broadcast_to(jnp.asarray(lower, dtype), shape),
        jnp.broadcast_to(jnp.asarray(upper, dtype), shape),
    )


def _bounded_problems(quick: bool) -> list[Problem]:
    inf = jnp.inf
    k1, k2, k3, k4, k5, k6 = jr.split(jr.key(1), 6)
    rosen10 = jnp.tile(jnp.array([-1.2, 1.0]), 5)
    rosen100 = jnp.tile(jnp.array([-1.2, 1.0]), 50)
    # Rosenbrock 100: every fourth variable must stay >= 1.1, the others <= 0.9.
    rosen_lower = jnp.where(jnp.arange(100) % 4 == 0, 1.1, -inf)
    rosen_upper = jnp.where(jnp.arange(100) % 4 == 0, inf, 0.9)
    powell = jnp.tile(jnp.array([3.0, -1.0, 0.0, 1.0]), 25)
    # Extended Powell with its first and third variables of each block >= 0.1.
    powell_lower = jnp.tile(jnp.array([0.1, -inf, 0.1, -inf]), 25)
    # NNLS: a solution with about half its entries at zero.
    matrix = jr.normal(k1, (200, 50))
    x_true = jr.normal(k2, (50,))
    b = matrix @ x_true + 0.1 * jr.normal(k3, (200,))
    # Logistic regression with every weight in [-0.3, 0.3] (the bias free).
    x = jr.normal(k4, (500, 20))
    w_true = jnp.linspace(-1, 1, 20)
    labels = (x @ w_true + 0.5 * jr.normal(k5, (500,)) > 0).astype(jnp.float64)
    logistic_lower = jnp.concatenate([jnp.full(20, -0.3), jnp.array([-inf])])
    logistic_upper = jnp.concatenate([jnp.full(20, 0.3), jnp.array([inf])])
    # The decay fit with the offset held >= 0.6 (the data's is 0.5).
    t = jnp.linspace(0, 4, 50)
    data = 2.0 * jnp.exp(-1.3 * t) + 0.5 + 0.01 * jnp.sin(37.0 * t)
    # A piecewise-constant signal in [0, 1] with noise, 10,000 samples.
    n = 10_000
    steps = jnp.repeat(jr.uniform(k6, (20,)), n // 20)
    signal = jnp.clip(steps, 0.0, 1.0)
    noisy = signal + 0.3 * jr.normal(jr.key(2), (n,))
    zeros = jnp.zeros
    problems = [
        Problem(
            "rosenbrock_10_box",
            rosenbrock,
            rosen10,
            None,
            1000,
            _box(rosen10, -2.0, 0.5),
        ),
        Problem(
            "rosenbrock_100_box",
            rosenbrock,
            rosen100,
            None,
            2000,
            (rosen_lower, rosen_upper),
        ),
        Problem(
            "extended_powell_box",
            extended_powell,
            powell,
            None,
            1000,
            (powell_lower, jnp.full(100, inf)),
        ),
        Problem(
            "beale_box",
            beale,
            jnp.array([1.0, 1.0]),
            None,
            1000,
            (jnp.array([-4.5, -4.5]), jnp.array([2.5, 4.5])),
        ),
        Problem(
            "decay_fit_box",
            decay_fit,
            jnp.array([1.0, 1.0, 0.7]),
            (t, data),
            1000,
            (jnp.array([0.0, 0.0, 0.6]), jnp.array([10.0, 10.0, 10.0])),
        ),
        Problem(
            "nnls_200x50", nnls, zeros(50), (matrix, b), 1000, _box(zeros(50), 0, inf)
        ),
        Problem(
            "logistic_box",
            logistic,
            zeros(21),
            (x, labels, 1e-3),
            1000,
            (logistic_lower, logistic_upper),
        ),
        Problem(
            "denoise_10000",
            denoise,
            jnp.full(n, 0.5),
            (noisy, 0.5, 0.1),
            2000,
            _box(zeros(n), 0.0, 1.0),
        ),
    ]
    if quick:
        problems = [p for p in problems if p.name == "nnls_200x50"]
    return problems


def solve_eqxopt_b(p: Problem):
    sol = eqxopt.minimize(
        p.fn,
        eqxopt.LBFGSB(),
        p.y0,
        p.args,
        bounds=p.bounds,
        max_steps=p.max_steps,
        rtol=0.0,
        atol=GTOL,
        throw=False,
    )
    return sol.value, sol.stats["num_fevals"]


def _jaxopt_b(fn, y0, args, bounds, max_steps):
    solver = jaxopt.LBFGSB(fun=fn, maxiter=max_steps, tol=GTOL)  # pyright: ignore
    y, state = solver.run(y0, bounds, args)
    return y, state.num_fun_eval


def solve_jaxopt_b(p: Problem):
    return jax.jit(_jaxopt_b, static_argnums=(0, 4))(
        p.fn, p.y0, p.args, p.bounds, p.max_steps
    )


BOUNDED_SOLVERS = {
    "eqxopt LBFGSB": solve_eqxopt_b,
    "scipy L-BFGS-B": solve_scipy,
}
if jaxopt is not None:
    BOUNDED_SOLVERS["jaxopt LBFGSB"] = solve_jaxopt_b


# --- measurement --------------------------------------------------------------------


def _block(x):
    return jax.block_until_ready(x)


def measure(solvers: dict, problem: Problem, repeats: int) -> dict:
    """Measure every solver on `problem`: first calls in turn, then `repeats` rounds
    of compiled runs with the solvers interleaved, so that all of them see the same
    load on a shared machine."""
    firsts = {}
    for name, solve in solvers.items():
        t0 = time.perf_counter()
        firsts[name] = _block(solve(problem)), time.perf_counter() - t0
    times = {name: [] for name in solvers}
    for _ in range(repeats):
        for name, solve in solvers.items():
            t0 = time.perf_counter()
            _block(solve(problem))
            times[name].append(time.perf_counter() - t0)
    out = {}
    for name, ((y, evals), first) in firsts.items():
        f = float(problem.fn(y, problem.args))
        g = jax.grad(problem.fn)(y, problem.args)
        if problem.bounds is not None:  # the projected gradient, L-BFGS-B's measure
            g = jnp.clip(y - g, *problem.bounds) - y
        gmax = float(jnp.max(jnp.abs(g)))
        converged = bool(np.isfinite(f)) and gmax <= 10 * GTOL * max(1.0, abs(f))
        out[name] = dict(
            converged=converged,
            evals=int(evals),
            time=statistics.median(times[name]),
            first=first,
            loss=f,
            gmax=gmax,
            y=np.asarray(y),
        )
    return out


def _geomean(xs):
    return math.exp(sum(math.log(max(x, 1e-12)) for x in xs) / len(xs))


def _print_row(p, name, r):
    print(
        f"{p.name:20s} {name:18s} conv={str(r['converged']):5s} "
        f"evals={r['evals']:6d} time={r['time'] * 1e3:9.2f} ms "
        f"first={r['first'] * 1e3:9.1f} ms  f={r['loss']:.3e} "
        f"|g|max={r['gmax']:.1e}",
        file=sys.stderr,
        flush=True,
    )


def _table(problems, names, rows):
    print("\n| problem | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for p in problems:
        cells = []
        for name in names:
            r = rows[p.name, name]
            mark = "" if r["converged"] else " (not conv.)"
            cells.append(
                f"{r['evals']} ev, {r['time'] * 1e3:.2f} ms, "
                f"1st {r['first'] * 1e3:.0f} ms{mark}"
            )
        print(f"| {p.name} | " + " | ".join(cells) + " |")


def run_unbounded(opts, repeats):
    problems = _problems(opts.quick)
    if opts.only:
        wanted = set(opts.only.split(","))
        problems = [p for p in problems if p.name in wanted]
    solvers = dict(SOLVERS)
    names = opts.solvers
    if opts.quick and not names:
        names = "eqxopt LBFGS,scipy L-BFGS-B,optax lbfgs"
    if names:
        solvers = {k: v for k, v in SOLVERS.items() if k in names.split(",")}
    rows = {}
    for p in problems:
        measured = measure(solvers, p, repeats)
        for name in solvers:
            rows[p.name, name] = measured[name]
            _print_row(p, name, measured[name])
    if not problems:
        return rows

    names = list(solvers)
    _table(problems, names, rows)
    print("\nSummary (geometric means over the problems; ratios to scipy / Optax):")
    if "scipy L-BFGS-B" not in names or "optax lbfgs" not in names:
        return rows
    scipy_evals = [rows[p.name, "scipy L-BFGS-B"]["evals"] for p in problems]
    optax_first = [rows[p.name, "optax lbfgs"]["first"] for p in problems]
    for name in names:
        evals = [rows[p.name, name]["evals"] for p in problems]
        times = [rows[p.name, name]["time"] for p in problems]
        firsts = [rows[p.name, name]["first"] for p in problems]
        conv = sum(rows[p.name, name]["converged"] for p in problems)
        print(
            f"- {name}: converged {conv}/{len(problems)}, evals x"
            f"{_geomean([e / s for e, s in zip(evals, scipy_evals)]):.2f} scipy, "
            f"compiled time {_geomean(times) * 1e3:.2f} ms, first call "
            f"{_geomean(firsts) * 1e3:.0f} ms (x"
            f"{_geomean([f / o for f, o in zip(firsts, optax_first)]):.2f} Optax)"
        )
    return rows


# Agreement with SciPy's solution: the loss to 1e-8 (relative), the point to 1e-3
# (relative to its largest entry: at `max|projected grad| <= 1e-6` an ill-conditioned
# problem is only that well determined), and the active set exactly (a variable is
# active when it is within 1e-9 of a bound).
LOSS_RTOL, Y_RTOL, ACTIVE_TOL = 1e-8, 1e-3, 1e-9


def _active(y, bounds):
    lower, upper = (np.asarray(b) for b in bounds)
    return (np.abs(y - lower) <= ACTIVE_TOL) | (np.abs(y - upper) <= ACTIVE_TOL)


def _agrees(r, ref, bounds):
    """`(same solution, number of variables whose active status differs)`."""
    same_loss = abs(r["loss"] - ref["loss"]) <= LOSS_RTOL * max(1.0, abs(ref["loss"]))
    scale = max(1.0, float(np.max(np.abs(ref["y"]))))
    same_y = float(np.max(np.abs(r["y"] - ref["y"]))) <= Y_RTOL * scale
    active = _active(r["y"], bounds)
    diff = int(np.sum(active != _active(ref["y"], bounds)))
    return same_loss and same_y, diff


def run_bounded(opts, repeats):
    problems = _bounded_problems(opts.quick)
    if opts.only:
        wanted = set(opts.only.split(","))
        problems = [p for p in problems if p.name in wanted]
    if not problems:
        return {}
    solvers = dict(BOUNDED_SOLVERS)
    rows = {}
    print("\nBounded set (L-BFGS-B):", file=sys.stderr)
    for p in problems:
        measured = measure(solvers, p, repeats)
        for name in solvers:
            rows[p.name, name] = measured[name]
            _print_row(p, name, measured[name])
    names = list(solvers)
    _table(problems, names, rows)
    ours, scipy_name = "eqxopt LBFGSB", "scipy L-BFGS-B"
    print(
        "\n| problem | n | active (scipy) | eqxopt vs scipy: same solution, active set "
        "| evals eqxopt / scipy |" + (" time eqxopt / jaxopt |" if jaxopt else "")
    )
    print("|---|---|---|---|---|" + ("---|" if jaxopt else ""))
    for p in problems:
        r, ref = rows[p.name, ours], rows[p.name, scipy_name]
        same, diff = _agrees(r, ref, p.bounds)
        cells = [
            p.name,
            str(p.y0.size),
            str(int(np.sum(_active(ref["y"], p.bounds)))),
            f"{'yes' if same else 'NO'}, "
            + ("same" if diff == 0 else f"{diff} differ"),
            f"{r['evals']} / {ref['evals']} = {r['evals'] / ref['evals']:.2f}",
        ]
        if jaxopt:
            jx = rows[p.name, "jaxopt LBFGSB"]
            cells.append(f"{r['time'] / jx['time']:.2f}")
        print("| " + " | ".join(cells) + " |")
    print("\nSummary (geometric means over the bounded problems):")
    for name in names:
        conv = sum(rows[p.name, name]["converged"] for p in problems)
        agree = sum(
            _agrees(rows[p.name, name], rows[p.name, scipy_name], p.bounds) == (True, 0)
            for p in problems
        )
        evals = _geomean(
            [
                rows[p.name, name]["evals"] / rows[p.name, scipy_name]["evals"]
                for p in problems
            ]
        )
        times = _geomean([rows[p.name, name]["time"] for p in problems])
        firsts = _geomean([rows[p.name, name]["first"] for p in problems])
        line = (
            f"- {name}: converged {conv}/{len(problems)}, same solution and active "
            f"set as scipy {agree}/{len(problems)}, evals x{evals:.2f} scipy, "
            f"compiled time {times * 1e3:.2f} ms, first call {firsts * 1e3:.0f} ms"
        )
        if jaxopt:
            # Over the problems both solved (an unconverged run's time says little).
            both = [
                rows[p.name, name]["time"] / rows[p.name, "jaxopt LBFGSB"]["time"]
                for p in problems
                if rows[p.name, name]["converged"]
                and rows[p.name, "jaxopt LBFGSB"]["converged"]
            ]
            if both:
                line += (
                    f" (compiled time x{_geomean(both):.2f} jaxopt over the "
                    f"{len(both)} problems both solved)"
                )
        print(line)
    return rows


def _fresh(fn):
    """A new function object computing `fn`: JAX (and eqxopt) cache traces and
    compiled programs per function object, so each call of a solver with it is a
    first call (tracing, lowering, compilation and the solve)."""

    def fresh(y, args):
        return fn(y, args)

    return fresh


def run_first_call(opts, repeats):
    """The first call of `minimize(fn, eqxopt.LBFGS(), y0)` against Optax's lbfgs loop
    on the unbounded set, in this one process: each measurement uses a new function
    object (so nothing is cached), the two solvers alternate which goes first, and one
    untimed call of each warms up JAX's own caches. Each call is timed in wall time
    (what a user waits for) and CPU time (`time.process_time`: less sensitive to other
    jobs on a shared machine, but it adds up the threads XLA compiles on, so it
    favours a compilation on fewer threads). Prints the per-problem medians and the
    medians of the per-problem ratios, wall time first."""
    problems = _problems(opts.quick)
    if opts.only:
        wanted = set(opts.only.split(","))
        problems = [p for p in problems if p.name in wanted]
    solvers = {"eqxopt LBFGS": solve_eqxopt, "optax lbfgs": solve_optax}
    warm = _problems(True)[0]
    for solve in solvers.values():
        _block(solve(warm._replace(fn=_fresh(warm.fn))))
    wall = {(p.name, name): [] for p in problems for name in solvers}
    cpu = {(p.name, name): [] for p in problems for name in solvers}
    for k in range(repeats):
        for p in problems:
            order = list(solvers.items())
            if k % 2:
                order.reverse()
            for name, solve in order:
                q = p._replace(fn=_fresh(p.fn))
                w0, c0 = time.perf_counter(), time.process_time()
                _block(solve(q))
                cpu[p.name, name].append(time.process_time() - c0)
                wall[p.name, name].append(time.perf_counter() - w0)
    print(
        "\n| problem | eqxopt LBFGS wall (CPU) | optax lbfgs wall (CPU) "
        "| eqxopt / Optax wall (CPU) |"
    )
    print("|---|---|---|---|")
    ratios = {"wall": [], "cpu": []}
    for p in problems:
        (ew, ow), (ec, oc) = [
            [statistics.median(times[p.name, name]) for name in solvers]
            for times in (wall, cpu)
        ]
        ratios["wall"].append(ew / ow)
        ratios["cpu"].append(ec / oc)
        print(
            f"| {p.name} | {ew * 1e3:.0f} ms ({ec * 1e3:.0f}) | {ow * 1e3:.0f} ms "
            f"({oc * 1e3:.0f}) | {ew / ow:.2f} ({ec / oc:.2f}) |"
        )
    for clock, label in (("wall", "wall time"), ("cpu", "CPU time")):
        r = ratios[clock]
        print(
            f"first call ({label}, median of {repeats} per problem): eqxopt / Optax "
            f"median {statistics.median(r):.2f} over {len(problems)} problems "
            f"(range {min(r):.2f}-{max(r):.2f})"
        )
    return dict(ratios=ratios["wall"], ratios_cpu=ratios["cpu"], wall=wall, cpu=cpu)


def run_vmap(opts, repeats):
    """Many starts of a multimodal problem: one `jax.vmap`ped solve against a Python
    loop of single (compiled) solves, time per lane."""
    lanes, dim = (8, 4) if opts.quick else (64, 4)
    y0s = jr.uniform(jr.key(3), (lanes, dim), jnp.float64, -5.0, 5.0)
    bounds = (jnp.full(dim, -5.0), jnp.full(dim, 5.0))

    def solve(y0):
        return eqxopt.minimize(
            styblinski_tang,
            eqxopt.LBFGSB(),
            y0,
            bounds=bounds,
            max_steps=200,
            rtol=0.0,
            atol=GTOL,
            throw=False,
        )

    batched = jax.jit(jax.vmap(solve))

    def run_vmapped():
        return _block(batched(y0s))

    def run_loop():
        return [_block(solve(y0)) for y0 in y0s]

    t0 = time.perf_counter()
    sols = run_vmapped()
    first_vmap = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_loop()
    first_loop = time.perf_counter() - t0
    times = {"vmap": [], "loop": []}
    for _ in range(repeats):
        for name, fn in (("vmap", run_vmapped), ("loop", run_loop)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    vmap_time = statistics.median(times["vmap"]) / lanes
    loop_time = statistics.median(times["loop"]) / lanes
    ok = int(jnp.sum(sols.result == eqxopt.RESULTS.successful))
    best = float(jnp.min(sols.loss))
    found = int(jnp.sum(sols.loss <= best + 1e-8))
    steps = np.asarray(sols.stats["num_steps"])
    print(
        f"\nvmap: {lanes} starts of Styblinski-Tang in [-5, 5]^{dim} with LBFGSB: "
        f"{ok}/{lanes} converged, {found} reach the best minimum ({best:.6f}), "
        f"steps per lane {steps.min()}-{steps.max()} (median "
        f"{int(np.median(steps))})\n"
        f"- time per lane: vmap {vmap_time * 1e3:.3f} ms, Python loop of single "
        f"compiled solves {loop_time * 1e3:.3f} ms (vmap x{vmap_time / loop_time:.3f}"
        f" the loop's)\n"
        f"- first call (with compilation): vmap {first_vmap:.2f} s, loop "
        f"{first_loop:.2f} s (one compilation, then {lanes - 1} cached calls)"
    )
    return dict(vmap=vmap_time, loop=loop_time, converged=ok, found=found)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").strip().splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--only", type=str, default=None, help="problem names")
    parser.add_argument("--solvers", type=str, default=None, help="solver names")
    parser.add_argument(
        "--bounded", action="store_true", help="run the bounded set (L-BFGS-B)"
    )
    parser.add_argument("--vmap", action="store_true", help="run the vmap section")
    parser.add_argument(
        "--first-call",
        action="store_true",
        help="first calls (wall and CPU time) of eqxopt LBFGS against Optax, repeated",
    )
    parser.add_argument(
        "--unbounded", action="store_true", help="run the unbounded set (L-BFGS)"
    )
    opts = parser.parse_args(argv)
    repeats = opts.repeats or (2 if opts.quick else 3 if opts.first_call else 5)
    everything = not (opts.bounded or opts.vmap or opts.unbounded or opts.first_call)
    if jaxopt is None:
        print("jaxopt is not installed: skipped.", file=sys.stderr)
    _block(jax.jit(lambda x: x + 1)(jnp.zeros(())))  # backend start-up, once
    out = {}
    if everything or opts.unbounded:
        out["unbounded"] = run_unbounded(opts, repeats)
    if everything or opts.bounded:
        out["bounded"] = run_bounded(opts, repeats)
    if everything or opts.vmap:
        out["vmap"] = run_vmap(opts, repeats)
    if opts.first_call:
        out["first_call"] = run_first_call(opts, repeats)
    return out


if __name__ == "__main__":
    main()
