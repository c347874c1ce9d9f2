"""Gradient accumulation in bfloat16: a bfloat16 MLP trained with micro-batches of 16
examples, accumulated over 4 calls (an effective batch of 64), with AdamW and NaN
gradients zeroed. Every 25th micro-batch is corrupted (its gradients are NaN), as a
bad record or an overflow would make them: the mean of that window is NaN, and
`ZeroNans` turns it into a zero gradient instead of NaN params.

The optimizer is the Optax scenario that used to break (`MultiSteps` around
`zero_nans`, bfloat16 params): here the state stays typed (bool NaN flags, int32
counters, bfloat16 moments) through every call, and the whole loop is one `lax.scan`.
It compares a bfloat16 accumulator (the params' dtype, the default) with a float32
one (`accumulator_dtype=jnp.float32`), against a float32 model trained the same way,
and plots the three loss curves.

    python examples/accumulation_bf16.py [--steps N] [--quick] [--out PATH]
"""

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr

import eqxopt


MICRO_BATCH, EVERY_K, CORRUPT_EVERY = 16, 4, 25


def target(x):
    return jnp.sin(2.0 * x[..., :1]) * jnp.cos(x[..., 1:])


def loss_fn(model, x, y):
    pred = jax.vmap(model)(x.astype(model.layers[0].weight.dtype))
    return jnp.mean((pred.astype(jnp.float32) - y) ** 2)


def make_optimizer(accumulator_dtype):
    inner = eqxopt.Chain(eqxopt.ZeroNans(), eqxopt.AdamW(3e-3, weight_decay=1e-4))
    return eqxopt.MultiSteps(
        inner, every_k=EVERY_K, accumulator_dtype=accumulator_dtype
    )


def train(dtype, accumulator_dtype, calls: int):
    """`calls` micro-batch calls in one `lax.scan`; returns the model and the loss of
    each call (on its own micro-batch, before the update)."""
    model = eqx.nn.MLP(2, 1, 64, 2, activation=jax.nn.tanh, key=jr.key(0), dtype=dtype)
    opt = make_optimizer(accumulator_dtype)
    state = opt.init(model)
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def body(carry, i):
        params, state = carry
        x = jr.uniform(jr.fold_in(jr.key(1), i), (MICRO_BATCH, 2), minval=-2, maxval=2)
        loss, grads = eqx.filter_value_and_grad(
            lambda p: loss_fn(eqx.combine(p, static), x, target(x))
        )(params)
        corrupt = (i + 1) % CORRUPT_EVERY == 0
        grads = jax.tree.map(lambda g: jnp.where(corrupt, jnp.nan, g), grads)
        params, state = opt.step(params, grads, state)
        return (params, state), loss

    @eqx.filter_jit
    def run(params, state):
        return jax.lax.scan(body, (params, state), jnp.arange(calls))

    (params, state), losses = run(params, state)
    # The state came back with exactly the types it was built with.
    assert eqx.tree_equal(
        jax.tree.map(lambda x: (x.shape, x.dtype), state),
        jax.tree.map(lambda x: (x.shape, x.dtype), opt.init(params)),
    )
    return eqx.combine(params, static), opt, state, losses


def main(steps: int, out: str | None):
    calls = steps * EVERY_K
    runs = {
        "bfloat16 params, bfloat16 accumulator": (jnp.bfloat16, None),
        "bfloat16 params, float32 accumulator": (jnp.bfloat16, jnp.float32),
        "float32 params": (jnp.float32, None),
    }
    curves, trained = {}, {}
    for name, (dtype, acc_dtype) in runs.items():
        model, opt, state, losses = train(dtype, acc_dtype, calls)
        trained[name] = (opt, model)
        # Mean loss over each accumulation window (one optimizer step).
        curve = losses.reshape(steps, EVERY_K).mean(axis=1)
        curves[name] = curve
        first, last = float(curve[:5].mean()), float(curve[-5:].mean())
        print(f"{name:40s} loss {first:.4f} -> {last:.4f}")
    print()
    print("The first run's state, leaf by leaf (bf16 moments, bool NaN flags):")
    print(eqxopt.verify(*trained["bfloat16 params, bfloat16 accumulator"]))

    if out is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, curve in curves.items():
            ax.plot(curve, label=name, lw=1.2)
        ax.set_yscale("log")
        ax.set_xlabel(f"optimizer step ({EVERY_K} micro-batches of {MICRO_BATCH})")
        ax.set_ylabel("training loss (window mean)")
        ax.set_title(
            "MultiSteps(Chain(ZeroNans(), AdamW)), NaN micro-batches", fontsize=10
        )
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out, dpi=120)
        print(f"saved {out}")
    return curves


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps")
    parser.add_argument("--quick", action="store_true", help="100 steps (for CI)")
    parser.add_argument("--out", default=None, help="where to save the plot (PNG)")
    args = parser.parse_args()
    curves = main(100 if args.quick else args.steps, args.out)
    for name, curve in curves.items():
        assert jnp.all(jnp.isfinite(curve)), f"{name}: a NaN got through"
        assert curve[-5:].mean() < 0.5 * curve[:5].mean(), f"{name}: no progress"
