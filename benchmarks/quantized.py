"""State bytes per parameter (from `eqxopt.verify`) and step time against float32-state
AdamW, for AdamW with int8, int4 and fp8 state, on trees of 10M and 50M parameters
(or `--params N[,N...]`). Run:
`python benchmarks/quantized.py [--params 10000000,50000000] [--steps 20] [--quick]`.
Prints one row per format and size; times are medians of jitted, donated steps on
the default backend (CPU here; the same script runs on a GPU), the formats timed in
interleaved rounds so that a change in the machine's load reaches all of them."""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import eqxopt


def make_params(n: int):
    # Four 2-D leaves (a model's matrices) and a small vector under min_size.
    side = int((n / 4) ** 0.5)
    keys = jax.random.split(jax.random.key(0), 4)
    out = {
        f"w{i}": jax.random.normal(k, (side, side), jnp.float32)
        for i, k in enumerate(keys)
    }
    out["b"] = jnp.zeros((1000,), jnp.float32)
    return out


def stepper(opt, params):
    """A function running one jitted, donated step (params and state) per call."""
    step = jax.jit(opt.step, donate_argnums=(0, 2))
    grads = jax.tree.map(lambda p: 1e-3 * jnp.ones_like(p), params)
    carry = [jax.tree.map(jnp.copy, params), opt.init(params)]
    carry[:] = step(carry[0], grads, carry[1])  # compile
    jax.block_until_ready(carry)

    def run():
        carry[:] = step(carry[0], grads, carry[1])
        jax.block_until_ready(carry)

    return run


FORMATS = [
    ("float32", None),
    ("int8", eqxopt.Quantized("int8")),
    ("int4", eqxopt.Quantized("int4")),
    ("fp8", eqxopt.Quantized("fp8")),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", default="10000000,50000000")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--quick", action="store_true", help="100k params, 2 steps (a smoke test)"
    )
    args = parser.parse_args()
    sizes = [int(n) for n in args.params.split(",")]
    if args.quick:
        sizes, args.steps = [100_000], 2
    print(f"AdamW, {jax.default_backend()}; median of {args.steps} steps")
    print(
        f"{'params':>11}  {'state':>8}  {'bytes/param':>11}  {'step ms':>8}  "
        f"{'vs float32':>10}"
    )
    for size in sizes:
        params = make_params(size)
        n = sum(x.size for x in jax.tree.leaves(params))
        opts = [eqxopt.AdamW(1e-3, state_dtype=sd) for _, sd in FORMATS]
        runs = [stepper(opt, params) for opt in opts]
        times = [[] for _ in runs]
        for _ in range(args.steps):  # interleaved rounds
            for run, out in zip(runs, times):
                t0 = time.perf_counter()
                run()
                out.append(time.perf_counter() - t0)
        base = float(np.median(times[0]))
        for (name, _), opt, t in zip(FORMATS, opts, times):
            nbytes = eqxopt.verify(opt, params).nbytes
            t = float(np.median(t))
            print(
                f"{n:11,}  {name:>8}  {nbytes / n:11.3f}  {1e3 * t:8.1f}  "
                f"{t / base:9.2f}x"
            )
        del runs


if __name__ == "__main__":
    main()
