"""JAX's persistent compilation cache and the first call of `eqxopt.minimize`.

Runs the same script twice, each time in a fresh Python process with the persistent
compilation cache in one (new, temporary) directory, and prints each process's first
call of `minimize(f, eqxopt.LBFGS(), y0)` (tracing, lowering, compilation or a cache
load, and the solve) and the ratio second / first. The first process compiles and
writes the executable to the cache; the second traces and lowers again (JAX caches no
traces across processes) but loads the executable instead of compiling it.

    python benchmarks/compile_cache.py [--quick] [--problem rosenbrock|logistic]
        [--repeats N]

Both problems (Rosenbrock 10; a logistic regression, 500 x 20) unless `--problem`
names one. With `--repeats N` the pair of processes runs N times per problem (a new
cache each time) and the medians are printed; `--quick` (the smoke test's mode) is
one pair on Rosenbrock.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile


_CHILD = r"""
import json, sys, time

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
# Cache every executable, however quick to compile or small (the defaults skip those
# that compile in under a second).
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

import jax.numpy as jnp
import jax.random as jr

import eqxopt

jax.block_until_ready(jnp.zeros(()) + 1)  # backend start-up, not measured


def rosenbrock(y, args):
    return jnp.sum(100.0 * (y[1:] - y[:-1] ** 2) ** 2 + (1.0 - y[:-1]) ** 2)


def logistic(w, args):
    x, labels = args
    logits = x @ w[:-1] + w[-1]
    return jnp.mean(jnp.logaddexp(0.0, logits) - labels * logits) + 1e-3 * jnp.sum(
        w[:-1] ** 2
    )


if sys.argv[2] == "rosenbrock":
    fn, y0, args = rosenbrock, jnp.tile(jnp.array([-1.2, 1.0]), 5), None
else:
    x = jr.normal(jr.key(0), (500, 20))
    labels = (x @ jnp.linspace(-1, 1, 20) > 0).astype(jnp.float64)
    fn, y0, args = logistic, jnp.zeros(21), (x, labels)
wall, cpu = time.perf_counter(), time.process_time()
sol = eqxopt.minimize(fn, eqxopt.LBFGS(), y0, args, max_steps=1000, atol=1e-6)
jax.block_until_ready(sol.value)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"wall": wall, "cpu": cpu, "fevals": int(sol.stats["num_fevals"])}))
"""


def _first_call(cache_dir: str, problem: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, cache_dir, problem],
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return json.loads(str(out.stdout).strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument(
        "--problem",
        choices=("rosenbrock", "logistic"),
        help="one problem (default: both; `--quick`: Rosenbrock)",
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="one pair of processes")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.repeats = 1
    if opts.problem:
        problems = [opts.problem]
    else:
        problems = ["rosenbrock"] if opts.quick else ["rosenbrock", "logistic"]
    return {problem: _measure(problem, opts.repeats) for problem in problems}


def _measure(problem: str, repeats: int) -> float:
    """`repeats` pairs of processes on `problem`; prints each and the medians, and
    returns the median wall-time ratio second / first."""
    firsts, seconds = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache_dir:
            first = _first_call(cache_dir, problem)
            second = _first_call(cache_dir, problem)
        assert first["fevals"] == second["fevals"]
        firsts.append(first)
        seconds.append(second)
        print(
            f"{problem}: first process {first['wall'] * 1e3:.0f} ms "
            f"(cpu {first['cpu'] * 1e3:.0f} ms), second process "
            f"{second['wall'] * 1e3:.0f} ms (cpu {second['cpu'] * 1e3:.0f} ms): "
            f"ratio {second['wall'] / first['wall']:.2f}",
            flush=True,
        )
    wall1 = statistics.median(r["wall"] for r in firsts)
    wall2 = statistics.median(r["wall"] for r in seconds)
    cpu1 = statistics.median(r["cpu"] for r in firsts)
    cpu2 = statistics.median(r["cpu"] for r in seconds)
    print(
        f"{problem}: median first call without the cache {wall1 * 1e3:.0f} ms, from "
        f"the cache {wall2 * 1e3:.0f} ms; ratio {wall2 / wall1:.2f} (cpu time "
        f"{cpu2 / cpu1:.2f})",
        flush=True,
    )
    return wall2 / wall1


if __name__ == "__main__":
    main()
