"""Full-batch minimisation benchmark: eqxopt L-BFGS against scipy, Optax, optimistix
(and jaxopt, when installed) on a fixed float64 test set.

For each problem and solver it reports whether the solver converged (final
`max|grad| <= 10 * GTOL * max(1, |f|)`), the number of function(+gradient) evaluations,
the median wall time of a compiled run (the solvers' runs interleaved, so that all of
them see the same load), and the first call including compilation.

    python benchmarks/minimize.py [--quick] [--repeats N] [--only NAME,...]

`--quick` (CI-sized smoke run) solves two problems (Rosenbrock 2, the decay fit) with
eqxopt, scipy and Optax, twice each. Every solver is asked
to stop at `max|grad| <= GTOL` (or its closest criterion) within the same `max_steps`.
"""

import argparse
import functools as ft
import math
import statistics
import sys
import time
from collections.abc import Callable
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
    import jaxopt
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


def _problems(quick: bool) -> list[Problem]:
    def rosen_start(n):
        return jnp.tile(jnp.array([-1.2, 1.0]), n // 2)

    key = jr.key(0)
    k1, k2, k3, k4 = jr.split(key, 4)
    n = 100
    q, _ = jnp.linalg.qr(jr.normal(k1, (n, n)))
    matrix = (q * jnp.logspace(0, 4, n)) @ q.T
    matrix = 0.5 * (matrix + matrix.T)
    b = jr.normal(k2, (n,))
    x = jr.normal(k3, (500, 20))
    w_true = jnp.linspace(-1, 1, 20)
    labels = (x @ w_true + 0.5 * jr.normal(k4, (500,)) > 0).astype(jnp.float64)
    t = jnp.linspace(0, 4, 50)
    data = 2.0 * jnp.exp(-1.3 * t) + 0.5 + 0.01 * jnp.sin(37.0 * t)
    problems = [
        Problem("rosenbrock_2", rosenbrock, rosen_start(2), None, 1000),
        Problem("rosenbrock_10", rosenbrock, rosen_start(10), None, 1000),
        Problem("rosenbrock_100", rosenbrock, rosen_start(100), None, 2000),
        Problem("rosenbrock_1000", rosenbrock, rosen_start(1000), None, 10_000),
        Problem(
            "extended_powell_100",
            extended_powell,
            jnp.tile(jnp.array([3.0, -1.0, 0.0, 1.0]), 25),
            None,
            1000,
        ),
        Problem("quadratic_cond1e4", quadratic, jnp.ones(n), (matrix, b), 2000),
        Problem("logistic_500x20", logistic, jnp.zeros(21), (x, labels, 1e-3), 1000),
        Problem("beale", beale, jnp.array([1.0, 1.0]), None, 1000),
        Problem("decay_fit", decay_fit, jnp.array([1.0, 1.0, 0.0]), (t, data), 1000),
    ]
    if quick:
        problems = [p for p in problems if p.name in ("rosenbrock_2", "decay_fit")]
    return problems


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

    res = scipy.optimize.minimize(
        fun,
        np.asarray(p.y0),
        jac=True,
        method="L-BFGS-B",
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
        gmax = float(jnp.max(jnp.abs(g)))
        converged = bool(np.isfinite(f)) and gmax <= 10 * GTOL * max(1.0, abs(f))
        out[name] = dict(
            converged=converged,
            evals=int(evals),
            time=statistics.median(times[name]),
            first=first,
            loss=f,
            gmax=gmax,
        )
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--only", type=str, default=None, help="problem names")
    parser.add_argument("--solvers", type=str, default=None, help="solver names")
    opts = parser.parse_args(argv)
    repeats = opts.repeats or (2 if opts.quick else 5)
    problems = _problems(opts.quick)
    if opts.only:
        wanted = set(opts.only.split(","))
        problems = [p for p in problems if p.name in wanted]
    solvers = dict(SOLVERS)
    if opts.quick and not opts.solvers:
        opts.solvers = "eqxopt LBFGS,scipy L-BFGS-B,optax lbfgs"
    if opts.solvers:
        solvers = {k: v for k, v in SOLVERS.items() if k in opts.solvers.split(",")}
    if jaxopt is None:
        print("jaxopt is not installed: skipped.", file=sys.stderr)
    _block(jax.jit(lambda x: x + 1)(jnp.zeros(())))  # backend start-up, once

    rows = {}
    for p in problems:
        measured = measure(solvers, p, repeats)
        for name in solvers:
            r = rows[p.name, name] = measured[name]
            print(
                f"{p.name:20s} {name:18s} conv={str(r['converged']):5s} "
                f"evals={r['evals']:6d} time={r['time'] * 1e3:9.2f} ms "
                f"first={r['first'] * 1e3:9.1f} ms  f={r['loss']:.3e} "
                f"|g|max={r['gmax']:.1e}",
                file=sys.stderr,
                flush=True,
            )

    names = list(solvers)
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

    def geomean(xs):
        return math.exp(sum(math.log(max(x, 1e-12)) for x in xs) / len(xs))

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
            f"{geomean([e / s for e, s in zip(evals, scipy_evals)]):.2f} scipy, "
            f"compiled time {geomean(times) * 1e3:.2f} ms, first call "
            f"{geomean(firsts) * 1e3:.0f} ms (x"
            f"{geomean([f / o for f, o in zip(firsts, optax_first)]):.2f} Optax)"
        )
    return rows


if __name__ == "__main__":
    main()
