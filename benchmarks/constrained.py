"""Constrained minimisation and Newton-CG against SciPy, in one run (issue #38's
targets): Hock-Schittkowski problems with published solutions solved by
`AugmentedLagrangian` and by SciPy's SLSQP (how many reach the published solution,
and the geometric mean of the ratio of evaluations), then `NewtonCG` against SciPy's
`trust-ncg` on Rosenbrock n=100 (evaluations and Hessian-vector products, from
several starts) and on a 10,000-variable convex quadratic (with compile and run
times).

Run: `PYTHONPATH=. python benchmarks/constrained.py` (float64); `--quick` (a smoke
test) takes the first Rosenbrock start and a 1,000-variable quadratic."""

import argparse
import math
import pathlib
import sys
import time

import jax


jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import eqxopt  # noqa: E402
from tests.test_minimize_constrained import _slsqp, _solve, PROBLEMS  # noqa: E402
from tests.test_minimize_newton_cg import (  # noqa: E402
    _trust_ncg,
    quadratic,
    rosenbrock,
)


def _reached(x, f, y_star, f_star):
    return bool(
        np.allclose(x, y_star, rtol=0, atol=1e-5)
        and np.isclose(f, f_star, rtol=1e-6, atol=1e-6)
    )


def constrained():
    print("Hock-Schittkowski problems: AugmentedLagrangian() vs SciPy SLSQP")
    print(f"{'problem':8} {'eqxopt':>8} {'fevals':>7} {'SLSQP':>8} {'fevals':>7}")
    ratios, solved, solved_ref = [], 0, 0
    for name in PROBLEMS:
        *_, y_star, f_star = PROBLEMS[name]()
        sol = _solve(name, throw=False)
        ref = _slsqp(name)
        ok = _reached(sol.value, sol.loss, y_star, f_star)
        ok_ref = _reached(ref.x, ref.fun, y_star, f_star)
        solved += ok
        solved_ref += ok_ref
        nfev = int(sol.stats["num_fevals"])
        ratios.append(nfev / ref.nfev)
        print(
            f"{name:8} {'solved' if ok else 'not':>8} {nfev:7d} "
            f"{'solved' if ok_ref else 'not':>8} {ref.nfev:7d}"
        )
    gmean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(
        f"solved: eqxopt {solved}/{len(PROBLEMS)}, SLSQP {solved_ref}/{len(PROBLEMS)};"
        f" evaluations eqxopt/SLSQP geometric mean {gmean:.2f}"
    )


def newton_cg(quick: bool = False):
    print("\nNewtonCG() vs SciPy trust-ncg, Rosenbrock n=100 (atol = gtol = 1e-8)")
    n = 100
    starts = {
        "[-1.2, 1]*50": jnp.tile(jnp.array([-1.2, 1.0]), 50),
        "zeros": jnp.zeros(n),
        "linspace(-1, 1)": jnp.linspace(-1.0, 1.0, n),
    }
    for k in range(3):
        key = jax.random.PRNGKey(k)
        starts[f"uniform(-2, 2) #{k}"] = jax.random.uniform(
            key, (n,), minval=-2, maxval=2
        )
    if quick:
        starts = dict(list(starts.items())[:1])
    fe, hv = [], []
    for name, y0 in starts.items():
        sol = eqxopt.minimize(
            rosenbrock, eqxopt.NewtonCG(), y0, rtol=0.0, atol=1e-8, max_steps=2000
        )
        ref = _trust_ncg(rosenbrock, y0, None, 1e-8)
        nf, nh = int(sol.stats["num_fevals"]), int(sol.stats["num_hvps"])
        fe.append(nf / ref.nfev)
        hv.append(nh / ref.nhev)
        print(
            f"  {name:18} fevals {nf:4d} vs {ref.nfev:4d}   hvps {nh:5d} vs "
            f"{ref.nhev:5d}   loss {float(sol.loss):.1e} vs {ref.fun:.1e}"
        )
    g = lambda r: math.exp(sum(map(math.log, r)) / len(r))
    print(f"  geometric mean ratio: fevals {g(fe):.3f}, hvps {g(hv):.3f}")

    n = 1_000 if quick else 10_000
    args = jnp.linspace(-1.0, 1.0, n)
    y0 = jnp.zeros(n)
    solve = jax.jit(
        lambda y, a: eqxopt.minimize(
            quadratic, eqxopt.NewtonCG(), y, a, rtol=0.0, atol=1e-8
        )
    )
    t = time.perf_counter()
    compiled = solve.lower(y0, args).compile()
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    sol = compiled(y0, args)
    sol.value.block_until_ready()
    run_s = time.perf_counter() - t
    t = time.perf_counter()
    ref = _trust_ncg(quadratic, y0, args, 1e-8)
    scipy_s = time.perf_counter() - t
    print(
        f"\nconvex quadratic n={n:,}: eqxopt fevals {int(sol.stats['num_fevals'])}, "
        f"hvps {int(sol.stats['num_hvps'])}; trust-ncg fevals {ref.nfev}, hvps "
        f"{ref.nhev}; max|x - x_scipy| {float(jnp.max(jnp.abs(sol.value - ref.x))):.1e}"
    )
    print(
        f"  eqxopt compile {compile_s:.2f} s + run {run_s:.3f} s; SciPy (jitted "
        f"value, gradient and hvp from JAX) {scipy_s:.3f} s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a smoke test")
    quick = parser.parse_args().quick
    constrained()
    newton_cg(quick)
