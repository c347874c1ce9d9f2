"""eqxopt.least_squares against SciPy's least_squares (method="trf"): a fit with
10,000 residuals and 10 parameters, 1,000 small fits under `vmap` against a SciPy
loop, and the first call (compile included) of a small fit. Prints ratios. Then a
matrix-free fit with 10^6 residuals and 10^4 parameters, whose dense Jacobian would
take 80 GB: its compiled program's peak memory.

    python benchmarks/least_squares.py
    python benchmarks/least_squares.py --quick   # every part smaller (a smoke test)
"""

import argparse
import os
import time


# SciPy's SVDs and XLA's QR both run on OpenBLAS, whose spin-waiting threads swamp
# both sides on a shared machine; one thread each (set before numpy is imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import jax  # noqa: E402


jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.optimize as so  # noqa: E402

import eqxopt  # noqa: E402


def _times(f, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return out


def _best(f, n=3):
    return min(_times(f, n))


def _median(f, n=200):
    return float(np.median(_times(f, n)))


def big(m: int = 10_000):
    rng = np.random.default_rng(0)
    t = np.linspace(0, 1, m)
    true = rng.uniform(0.5, 1.5, 10)
    k = np.arange(1, 6)

    def model(p, t):
        return sum(p[i] * jnp.exp(-p[i + 5] * k[i] * t) for i in range(5))

    y = np.asarray(model(jnp.asarray(true), t)) + 1e-3 * rng.normal(size=t.size)
    res = lambda p, a: model(p, t) - y
    p0 = jnp.ones(10)
    solve = jax.jit(lambda p0: eqxopt.least_squares(res, None, p0, throw=False))
    sol = solve(p0)
    jax.block_until_ready(sol.value)
    ours = _best(lambda: jax.block_until_ready(solve(p0).value))
    f = jax.jit(lambda p: res(p, None))
    J = jax.jit(jax.jacfwd(lambda p: res(p, None)))
    f(p0), J(p0)
    run = lambda: so.least_squares(
        lambda p: np.asarray(f(jnp.asarray(p))),
        np.ones(10),
        jac=lambda p: np.asarray(J(jnp.asarray(p))),
    )
    ref = run()
    theirs = _best(run)
    print(
        f"{m:,} x 10 fit: eqxopt {ours * 1e3:.1f} ms (cost {float(sol.loss):.6g}, "
        f"nfev {int(sol.stats['num_fevals'])}), SciPy {theirs * 1e3:.1f} ms (cost "
        f"{ref.cost:.6g}, nfev {ref.nfev}); ratio eqxopt/SciPy {ours / theirs:.3f}"
    )
    # The floor: the solve's residual and Jacobian evaluations alone, each a jitted
    # call of its own (no solver work, but each call's dispatch, which dominates a
    # small fit's), as often as the solve made them.
    nfev, njev = int(sol.stats["num_fevals"]), int(sol.stats["num_jevals"])
    per_f = _median(lambda: jax.block_until_ready(f(p0)))
    per_J = _median(lambda: jax.block_until_ready(J(p0)))
    floor = nfev * per_f + njev * per_J
    print(
        f"  floor: {nfev} residual evaluations ({per_f * 1e3:.3f} ms each) and {njev} "
        f"Jacobians ({per_J * 1e3:.3f} ms each) take {floor * 1e3:.1f} ms, "
        f"{floor / theirs:.3f}x SciPy's solve; the solve is {ours / floor:.2f}x "
        "its floor"
    )


def batched(count: int = 1000):
    rng = np.random.default_rng(1)
    t = np.linspace(0, 4, 30)
    a = rng.uniform(1, 3, count)
    k = rng.uniform(0.5, 2, count)
    ys = a[:, None] * np.exp(-k[:, None] * t) + 0.01 * rng.normal(size=(count, 30))
    res = lambda p, y: p[0] * jnp.exp(-p[1] * t) - y
    solve = jax.jit(
        jax.vmap(
            lambda y: eqxopt.least_squares(res, None, jnp.ones(2), y, throw=False).value
        )
    )
    yj = jnp.asarray(ys)
    jax.block_until_ready(solve(yj))
    ours = _best(lambda: jax.block_until_ready(solve(yj)))
    f = jax.jit(res)
    J = jax.jit(jax.jacfwd(res))

    def loop():
        for y in ys:
            so.least_squares(
                lambda p: np.asarray(f(jnp.asarray(p), y)),
                np.ones(2),
                jac=lambda p: np.asarray(J(jnp.asarray(p), y)),
            )

    loop()
    theirs = _best(loop, 1)
    print(
        f"{count:,} fits under vmap: eqxopt {ours * 1e3:.1f} ms, SciPy loop "
        f"{theirs * 1e3:.1f} ms; speed-up {theirs / ours:.1f}x"
    )


def first_call():
    t = np.linspace(0, 4, 20)
    y = 3.0 * np.exp(-1.5 * t)

    def res(p, a):
        return p[0] * jnp.exp(-p[1] * t) - y

    start = time.perf_counter()
    sol = eqxopt.least_squares(res, None, jnp.array([1.0, 0.5]))
    jax.block_until_ready(sol.value)
    ours = time.perf_counter() - start

    def res2(p):  # a new function: SciPy's path pays its own jit
        return p[0] * jnp.exp(-p[1] * t) - y

    start = time.perf_counter()
    f = jax.jit(res2)
    J = jax.jit(jax.jacfwd(res2))
    so.least_squares(
        lambda p: np.asarray(f(jnp.asarray(p))),
        np.array([1.0, 0.5]),
        jac=lambda p: np.asarray(J(jnp.asarray(p))),
    )
    theirs = time.perf_counter() - start
    print(
        f"first call of a small fit: eqxopt {ours:.2f} s, SciPy driving jitted JAX "
        f"{theirs:.2f} s; ratio {ours / theirs:.2f}"
    )


def matrix_free(m: int, n: int):
    """A smooth positive profile, `exp` of a piecewise-linear curve through `n` knots,
    fitted to `m` noisy samples with `TrustRegionReflective(jac="matrix-free")`."""
    rng = np.random.default_rng(2)
    t = jnp.linspace(0.0, 1.0, m)
    knots = jnp.linspace(0.0, 1.0, n)
    true = jnp.asarray(np.cumsum(rng.normal(size=n)) * 0.01)
    noise = 1e-3 * jnp.asarray(rng.normal(size=m))
    data = jnp.exp(jnp.interp(t, knots, true)) + noise

    def res(y, data):
        return jnp.exp(jnp.interp(t, knots, y)) - data

    solver = eqxopt.TrustRegionReflective(jac="matrix-free")
    solve = jax.jit(
        lambda y0, data: eqxopt.least_squares(res, solver, y0, data, throw=False)
    )
    y0 = jnp.zeros(n)
    start = time.perf_counter()
    compiled = solve.lower(y0, data).compile()
    compile_s = time.perf_counter() - start
    mem = compiled.memory_analysis()
    peak = (
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes
    )
    start = time.perf_counter()
    sol = compiled(y0, data)
    jax.block_until_ready(sol.value)
    run_s = time.perf_counter() - start
    dense = m * n * 8
    ok = sol.result == eqxopt.RESULTS.successful
    outcome = "successful" if ok else str(sol.result)
    noise_cost = 0.5 * float(jnp.sum(noise**2))
    print(
        f"matrix-free fit, {m:,} residuals x {n:,} params: {outcome}, "
        f"{int(sol.stats['num_steps'])} steps, cost {float(sol.loss):.4g} (the "
        f"noise's {noise_cost:.4g}), max|y - true| "
        f"{float(jnp.max(jnp.abs(sol.value - true))):.1e}; compile {compile_s:.1f} s, "
        f"run {run_s:.1f} s; peak memory of the compiled solve {peak / 1e6:.0f} MB "
        f"(temporaries {mem.temp_size_in_bytes / 1e6:.0f} MB), where the dense "
        f"Jacobian alone would take {dense / 1e9:.3g} GB"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--quick", action="store_true", help="every part smaller (a smoke test)"
    )
    quick = parser.parse_args().quick
    first_call()
    if quick:  # every part, smaller
        big(1_000), batched(50), matrix_free(10_000, 100)
    else:
        big(), batched(), matrix_free(1_000_000, 10_000)
