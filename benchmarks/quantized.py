"""State bytes per parameter (from `eqxopt.verify`) and step time against float32-state
AdamW, for AdamW with int8, int4 and fp8 state, on one 10M-parameter tree (or
`--params N`). Run:
`python benchmarks/quantized.py [--params 10000000] [--steps 20] [--quick]`. Prints
one row per format; times are medians of jitted, donated steps on the default backend
(CPU here; the same script runs on a GPU)."""

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


def time_steps(opt, params, steps: int) -> float:
    step = jax.jit(opt.step, donate_argnums=(0, 2))  # params and state donated
    grads = jax.tree.map(lambda p: 1e-3 * jnp.ones_like(p), params)
    state = opt.init(params)
    p = jax.tree.map(jnp.copy, params)
    p, state = step(p, grads, state)  # compile
    jax.block_until_ready((p, state))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        p, state = step(p, grads, state)
        jax.block_until_ready((p, state))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, default=10_000_000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--quick", action="store_true", help="100k params, 2 steps (a smoke test)"
    )
    args = parser.parse_args()
    if args.quick:
        args.params, args.steps = 100_000, 2
    params = make_params(args.params)
    n = sum(x.size for x in jax.tree.leaves(params))
    print(f"AdamW, {n:,} params, {jax.default_backend()}")
    print(f"{'state':>8}  {'bytes/param':>11}  {'step ms':>8}  {'vs float32':>10}")
    base = None
    for name, sd in [
        ("float32", None),
        ("int8", eqxopt.Quantized("int8")),
        ("int4", eqxopt.Quantized("int4")),
        ("fp8", eqxopt.Quantized("fp8")),
    ]:
        opt = eqxopt.AdamW(1e-3, state_dtype=sd)
        nbytes = eqxopt.verify(opt, params).nbytes
        t = time_steps(opt, params, args.steps)
        base = t if base is None else base
        print(f"{name:>8}  {nbytes / n:11.3f}  {1e3 * t:8.1f}  {t / base:9.2f}x")


if __name__ == "__main__":
    main()
