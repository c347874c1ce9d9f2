"""Fit overlapping spectral lines whose parameters must stay in a box, with L-BFGS-B.

A spectrum of three overlapping Lorentzian lines on a flat background,

    s(x) = b + sum_i a_i w_i^2 / ((x - c_i)^2 + w_i^2),

is measured at 400 points with noise. The physics puts every parameter in a box: the
amplitudes a_i and the background b are non-negative (the detector counts photons,
after dark subtraction), the centres c_i lie in the measured window, and no line is
narrower than the instrument's resolution (w_i >= 0.15) or wider than 2. The narrowest
line in the data is at the resolution limit and the background is zero, so the best
fit has active bounds.

1. One fit from a rough guess with `eqxopt.minimize(..., eqxopt.LBFGSB(),
   bounds=(lower, upper))` (the bounds are PyTrees like the parameters), checked
   against SciPy's L-BFGS-B from the same start: same solution, same active bounds;
   the evaluation counts of both are printed.
2. A multi-start search: the line positions make the loss multimodal, so 64 random
   starts inside the box are solved at once with `jax.vmap(minimize)`, and the best
   is kept.

It saves a plot of the data, the best fit and its lines, and the final loss of every
start.

    python examples/bounded_fit.py [--quick] [--out PATH]
"""

import argparse
import os
import time

import jax


jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import jax.random as jr
import numpy as np
import scipy.optimize
from jax.flatten_util import ravel_pytree

import eqxopt


TRUE = {
    "amplitude": jnp.array([1.0, 0.6, 0.8]),
    "centre": jnp.array([2.6, 3.3, 5.0]),
    "width": jnp.array([0.35, 0.15, 0.5]),
    "background": jnp.array(0.0),
}
LOWER = {
    "amplitude": 0.0,
    "centre": 0.0,
    "width": 0.15,  # the instrument's resolution
    "background": 0.0,
}
UPPER = {
    "amplitude": 10.0,
    "centre": 10.0,
    "width": 2.0,
    "background": jnp.inf,  # open
}


def spectrum(params, x):
    a, c, w = params["amplitude"], params["centre"], params["width"]
    lines = a * w**2 / ((x[:, None] - c) ** 2 + w**2)
    return params["background"] + jnp.sum(lines, axis=1)


def loss(params, data):
    x, y = data
    return 0.5 * jnp.sum((spectrum(params, x) - y) ** 2)


def make_data(n: int, noise: float = 0.03):
    x = jnp.linspace(0.0, 10.0, n)
    return x, spectrum(TRUE, x) + noise * jr.normal(jr.key(0), (n,))


GUESS = {
    "amplitude": jnp.array([0.5, 0.5, 0.5]),
    "centre": jnp.array([2.0, 3.5, 5.5]),
    "width": jnp.array([0.5, 0.5, 0.5]),
    "background": jnp.array(0.1),
}


def solve(y0, data, throw=True):
    return eqxopt.minimize(
        loss,
        eqxopt.LBFGSB(),
        y0,
        data,
        bounds=(LOWER, UPPER),
        max_steps=500,
        rtol=0.0,
        atol=1e-8,
        throw=throw,
    )


def solve_scipy(y0, data):
    """SciPy's L-BFGS-B on the same loss (flattened), from the same start, with the
    same stopping rule (max |projected gradient| <= 1e-8)."""
    flat0, unravel = ravel_pytree(y0)
    value_and_grad = jax.jit(jax.value_and_grad(lambda v: loss(unravel(v), data)))

    def bound(b):  # a bound (scalars per leaf) as a flat vector like `flat0`
        full = jax.tree.map(lambda v, p: jnp.broadcast_to(v, jnp.shape(p)), b, y0)
        return np.asarray(ravel_pytree(full)[0])

    def fun(v):
        value, grad = value_and_grad(jnp.asarray(v))
        return float(value), np.asarray(grad)

    res = scipy.optimize.minimize(
        fun,
        np.asarray(flat0),
        jac=True,
        method="L-BFGS-B",
        bounds=list(zip(bound(LOWER).tolist(), bound(UPPER).tolist())),
        options=dict(gtol=1e-8, ftol=0.0, maxiter=500),
    )
    return unravel(jnp.asarray(res.x)), res


def active_bounds(params):
    """The names of the parameters held at a bound."""
    out = []
    for name, value in params.items():
        value = np.atleast_1d(np.asarray(value))
        lower = np.broadcast_to(np.asarray(LOWER[name]), value.shape)
        upper = np.broadcast_to(np.asarray(UPPER[name]), value.shape)
        for i, (v, lo, hi) in enumerate(zip(value, lower, upper)):
            if v == lo or v == hi:
                out.append(f"{name}[{i}]={v:g}" if value.size > 1 else f"{name}={v:g}")
    return out


def random_starts(key, num):
    """`num` starting points, uniformly distributed in (a bounded part of) the box."""
    ka, kc, kw, kb = jr.split(key, 4)
    return {
        "amplitude": jr.uniform(ka, (num, 3), jnp.float64, 0.1, 2.0),
        "centre": jr.uniform(kc, (num, 3), jnp.float64, 0.0, 10.0),
        "width": jr.uniform(kw, (num, 3), jnp.float64, 0.15, 2.0),
        "background": jr.uniform(kb, (num,), jnp.float64, 0.0, 0.5),
    }


def plot(data, best, losses, path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10})
    x, y = data
    fig, (ax1, ax2) = plt.subplots(
        1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]}
    )
    ax1.plot(x, y, ".", ms=3, color="0.6", label="noisy spectrum")
    ax1.plot(x, spectrum(best, x), lw=2, color="C0", label="best fit (L-BFGS-B)")
    for k, i in enumerate(np.argsort(np.asarray(best["centre"]))):
        one = {
            "amplitude": best["amplitude"][i : i + 1],
            "centre": best["centre"][i : i + 1],
            "width": best["width"][i : i + 1],
            "background": best["background"],
        }
        ax1.plot(
            x,
            spectrum(one, x),
            "--",
            lw=1.2,
            color=f"C{k + 1}",
            label=f"line {k + 1}: c={float(best['centre'][i]):.2f}, "
            f"w={float(best['width'][i]):.2f}",
        )
    ax1.set_xlabel("frequency (arbitrary units)")
    ax1.set_ylabel("intensity")
    ax1.set_title("three Lorentzian lines, bounded fit")
    ax1.legend(loc="upper right", fontsize=9)  # the lines are all left of x = 7
    ax1.set_ylim(-0.1, 1.45)
    ax1.grid(True, alpha=0.3)

    order = np.sort(np.asarray(losses))
    best_loss = order[0]
    hit = order <= best_loss * (1 + 1e-6)
    ax2.semilogy(
        np.arange(len(order))[hit],
        order[hit],
        "o",
        color="C0",
        label="reach the best minimum",
    )
    ax2.semilogy(
        np.arange(len(order))[~hit],
        order[~hit],
        "o",
        color="C3",
        mfc="none",
        label="stop in another local minimum",
    )
    ax2.set_xlabel("start (sorted by final loss)")
    ax2.set_ylabel("final loss")
    ax2.set_title(f"{len(order)} random starts, one vmapped solve")
    ax2.legend(loc="upper left", fontsize=9)
    ax2.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(quick: bool = False, out: str | None = None):
    n, num_starts = (200, 16) if quick else (400, 64)
    data = make_data(n)

    # 1. One fit from a rough guess, against SciPy.
    start = time.perf_counter()
    sol = solve(GUESS, data)
    elapsed = time.perf_counter() - start
    ref, res = solve_scipy(GUESS, data)
    diff = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(sol.value), jax.tree.leaves(ref))
    )
    print(
        f"single fit: {eqxopt.RESULTS[sol.result] or 'successful'}, loss "
        f"{float(sol.loss):.6f} (scipy {res.fun:.6f}); evaluations: eqxopt "
        f"{int(sol.stats['num_fevals'])}, scipy {res.nfev}; first call (with "
        f"compilation) {elapsed:.2f} s"
    )
    print(f"  largest difference from scipy's solution: {diff:.1e}")
    ours, theirs = active_bounds(sol.value), active_bounds(ref)
    print(
        f"  active bounds: {', '.join(ours) or 'none'} (scipy: same)"
        if ours == theirs
        else f"  active bounds differ: {ours} vs {theirs}"
    )
    assert diff < 1e-5 and ours == theirs, "the fit differs from SciPy's"

    # 2. Multi-start: every start is solved at once, each lane with its own result.
    starts = random_starts(jr.key(1), num_starts)
    batched = jax.jit(jax.vmap(lambda y0: solve(y0, data, throw=False)))
    start = time.perf_counter()
    sols = jax.block_until_ready(batched(starts))
    elapsed = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(batched(starts))
    again = time.perf_counter() - start
    losses = np.asarray(sols.loss)
    i = int(np.argmin(losses))
    best = jax.tree.map(lambda leaf: leaf[i], sols.value)
    reach = int(np.sum(losses <= losses[i] * (1 + 1e-6)))
    ok = int(jnp.sum(sols.result == eqxopt.RESULTS.successful))
    print(
        f"multi-start: {num_starts} starts, {ok} converged, {reach} reach the best "
        f"loss {losses[i]:.6f}; vmapped solve {elapsed:.2f} s with compilation, "
        f"{again * 1e3:.0f} ms compiled ({again / num_starts * 1e3:.2f} ms a start)"
    )
    print("  best fit (lines sorted by centre) against the true parameters:")
    order = np.argsort(np.asarray(best["centre"]))
    for name in ("amplitude", "centre", "width"):
        fitted = np.asarray(best[name])[order]
        print(f"  {name:10s} true {np.asarray(TRUE[name])}  fitted {fitted.round(4)}")
    print(f"  background true 0  fitted {float(best['background']):.4g}")
    assert reach >= 1 and losses[i] <= float(sol.loss) * (1 + 1e-6)

    path = out or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "out", "bounded_fit.png"
    )
    plot(data, best, losses, path)
    print(f"saved {path}")
    return sol, sols


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").strip().splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="fewer starts, for CI")
    parser.add_argument("--out", default=None, help="where to save the PNG")
    args = parser.parse_args()
    main(args.quick, args.out)
