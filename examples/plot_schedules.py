"""Plot every schedule in `eqxopt.schedules` over 1,000 steps (for the docs).

Run as `python examples/plot_schedules.py [--out docs/_static/schedules.png]`.
"""

import argparse

import jax
import jax.numpy as jnp
import matplotlib


matplotlib.use("Agg")
import matplotlib.pyplot as plt

from eqxopt import schedules as s


SCHEDULES = {
    "Constant(1.0)": s.Constant(1.0),
    "Linear(1, 0.1, 800, 100)": s.Linear(1.0, 0.1, 800, 100),
    "Polynomial(1, 0, 2, 1000)": s.Polynomial(1.0, 0.0, 2, 1000),
    "ExponentialDecay(1, 100, 0.7)": s.ExponentialDecay(1.0, 100, 0.7),
    "ExponentialDecay(staircase)": s.ExponentialDecay(1.0, 200, 0.5, staircase=True),
    "CosineDecay(1, 1000, alpha=0.1)": s.CosineDecay(1.0, 1000, alpha=0.1),
    "WarmupCosineDecay(0, 1, 100, 1000)": s.WarmupCosineDecay(0.0, 1.0, 100, 1000),
    "WarmupConstant(0, 1, 200)": s.WarmupConstant(0.0, 1.0, 200),
    "WarmupExponentialDecay": s.WarmupExponentialDecay(0.0, 1.0, 100, 100, 0.7),
    "PiecewiseConstant": s.PiecewiseConstant(1.0, {300: 0.5, 600: 0.2}),
    "PiecewiseInterpolate(cosine)": s.PiecewiseInterpolate(
        "cosine", 1.0, {300: 0.5, 600: 0.2}
    ),
    "SGDR (3 cycles)": s.SGDR(
        [dict(init_value=0.0, peak_value=1.0, warmup_steps=50, decay_steps=333)] * 3
    ),
    "CosineOneCycle(1000, 1)": s.CosineOneCycle(1000, 1.0),
    "LinearOneCycle(1000, 1)": s.LinearOneCycle(1000, 1.0),
    "WarmupStableDecay": s.WarmupStableDecay(0.0, 1.0, 100, 600, 300),
    "InverseSqrt(1, warmup_steps=100)": s.InverseSqrt(1.0, warmup_steps=100),
}


def main(out: str):
    counts = jnp.arange(1000, dtype=jnp.int32)
    fig, axes = plt.subplots(4, 4, figsize=(14, 11), sharex=True)
    for ax, (name, schedule) in zip(axes.flat, SCHEDULES.items()):
        values = jax.vmap(schedule)(counts)
        ax.plot(counts, values)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.suptitle("eqxopt.schedules", fontsize=14)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="docs/_static/schedules.png")
    main(parser.parse_args().out)
