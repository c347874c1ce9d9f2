"""JAX's persistent compilation cache and the first call of a full-batch solve.

For each problem of the unbounded set of `benchmarks/minimize.py` and each solver
(`eqxopt.minimize(fn, eqxopt.LBFGS(), y0)`, and Optax's lbfgs loop as that script runs
it, with the same stopping rule), runs the same solve twice, each time in a fresh
Python process with the persistent compilation cache in one (new, temporary)
directory, and prints each process's first call (tracing, lowering, compilation or a
cache load, and the solve) and the ratio second / first. The first process compiles
and writes the executable to the cache; the second traces and lowers again (JAX
caches no traces across processes) but loads the executable instead of compiling it.

    python benchmarks/compile_cache.py [--quick] [--only NAME,...]
        [--solvers eqxopt,optax] [--repeats N]

Every problem of the set and both solvers by default; with `--repeats N` (default 3)
each pair of processes runs N times (a new cache each time) and the medians are
printed, then per solver the median over the problems of the per-problem ratios.
`--quick` (the smoke test's mode) is one pair, eqxopt on Rosenbrock 10.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


_CHILD = r"""
import json, sys, time

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
# Cache every executable, however quick to compile or small (the defaults skip those
# that compile in under a second).
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

sys.path.insert(0, sys.argv[4])
import minimize as bench  # the benchmark set and its solvers

problem = bench._problems(False, [sys.argv[2]])[0]
solve = {"eqxopt": bench.solve_eqxopt, "optax": bench.solve_optax}[sys.argv[3]]
jax.block_until_ready((problem.y0, problem.args))  # data and backend start-up
wall, cpu = time.perf_counter(), time.process_time()
y, fevals = solve(problem)
jax.block_until_ready(y)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"wall": wall, "cpu": cpu, "fevals": int(fevals)}))
"""

_HERE = Path(__file__).resolve().parent


def _first_call(cache_dir: str, problem: str, solver: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, cache_dir, problem, solver, str(_HERE)],
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return json.loads(str(out.stdout).strip().splitlines()[-1])


def _measure(problem: str, solver: str, repeats: int) -> dict:
    """`repeats` pairs of processes; the medians of their first calls."""
    firsts, seconds = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache_dir:
            first = _first_call(cache_dir, problem, solver)
            second = _first_call(cache_dir, problem, solver)
        # The same executable: the same solve to the last evaluation.
        assert first["fevals"] == second["fevals"], (first, second)
        firsts.append(first)
        seconds.append(second)
    med = lambda rows, key: statistics.median(r[key] for r in rows)
    row = {
        "first": med(firsts, "wall"),
        "second": med(seconds, "wall"),
        "ratio": statistics.median(
            s["wall"] / f["wall"] for f, s in zip(firsts, seconds)
        ),
        "ratio_cpu": med(seconds, "cpu") / med(firsts, "cpu"),
    }
    print(
        f"{problem} {solver}: first process {row['first'] * 1e3:.0f} ms, second "
        f"{row['second'] * 1e3:.0f} ms: ratio {row['ratio']:.2f} (cpu "
        f"{row['ratio_cpu']:.2f}; median of {repeats})",
        flush=True,
    )
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--only", help="comma-separated problem names")
    parser.add_argument("--solvers", default="eqxopt,optax", help="eqxopt, optax")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one pair, one problem")
    opts = parser.parse_args(argv)
    solvers = opts.solvers.split(",")
    if opts.quick:
        names, solvers, opts.repeats = ["rosenbrock_10"], ["eqxopt"], 1
    else:
        import minimize as bench  # (this script's folder is on `sys.path`)

        wanted = opts.only.split(",") if opts.only else bench.UNBOUNDED
        names = [name for name in bench.UNBOUNDED if name in wanted]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            parser.error(f"unknown problems {unknown}; the set: {bench.UNBOUNDED}")
    rows = {(p, s): _measure(p, s, opts.repeats) for p in names for s in solvers}

    heads = [f"{s} first / second (ratio)" for s in solvers]
    print("\n| problem | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(solvers))
    for p in names:
        cells = [
            f"{rows[p, s]['first'] * 1e3:.0f} / {rows[p, s]['second'] * 1e3:.0f} ms "
            f"({rows[p, s]['ratio']:.2f})"
            for s in solvers
        ]
        print(f"| {p} | " + " | ".join(cells) + " |")
    summary = {}
    for s in solvers:
        ratios = [rows[p, s]["ratio"] for p in names]
        summary[s] = statistics.median(ratios)
        print(
            f"{s}: second / first process, median over {len(names)} problems "
            f"{summary[s]:.2f} (range {min(ratios):.2f}-{max(ratios):.2f}; target 0.3)"
        )
    if "eqxopt" in solvers and "optax" in solvers:
        seconds = [
            rows[p, "eqxopt"]["second"] / rows[p, "optax"]["second"] for p in names
        ]
        print(
            "second process, eqxopt / Optax: median "
            f"{statistics.median(seconds):.2f} (range {min(seconds):.2f}-"
            f"{max(seconds):.2f})"
        )
    return dict(rows=rows, summary=summary)


if __name__ == "__main__":
    main()
