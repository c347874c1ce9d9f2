"""Matrix preconditioners against their matmul floor and against AdamW.

On the transformer-like tree of `_common.transformer_shapes` (Equinox's `(out, in)`
layout, 63 float32 leaves: an embedding, per layer `qkv (3d, d)`, `out (d, d)`,
`up (4d, d)`, `down (d, 4d)`, biases and layer norms), at about 10M and 50M params
(`--quick`: 0.2M), this script measures in one process, interleaved (A B C, C B A,
...), jitted steps that donate params and state:

- `matmul N`: a jitted `(N, N) @ (N, N)` float32 matmul for each `N` of
  `--matmul-size` (default 1024); the fastest of their FLOPs per second is *the
  measured matmul rate* of this machine (on a GPU, small matmuls are far from its
  rate: give a large `N` too, e.g. `--matmul-size 1024,8192`);
- `Muon`, `NorMuon`: one step. Their floor is the Newton-Schulz FLOPs of the step
  over the matmul rate (see `newton_schulz_flops`: the count follows
  `eqxopt._matrix.linalg.newton_schulz` exactly, matmuls only);
- `AdamW`: one step (memory-bound: the reference for the preconditioners);
- `SOAP (regular)`, `SOAP (refresh)`: `SOAP(precondition_frequency=10)` steps with
  the state's count held at 11 (an Adam step) and at 10 (an Adam step plus the
  eigenbasis refresh: power iteration and QR per factor, the moments rotated). The
  amortised step over any 10 consecutive steps is `(9 regular + 1 refresh) / 10`;
  with `--soap-direct` (default at or below 1M) the script also times repeats of
  10 consecutive real steps (`SOAP (10 steps)`), which include exactly one refresh;
- with `--more`: `Shampoo(preconditioning_compute_steps=10)` and `Kron` likewise
  (Shampoo's inverse roots every 10 steps, amortised as SOAP's; Kron's default
  preconditioner-update probability is 1 for its first 200 steps, so its figure is
  one step that updates the preconditioner).

With `--decompositions 392,1176,1568` it first times QR and `eigh` of matrices of
those sizes, one alone and stacks of 5 mapped by `jax.vmap` or by a `lax.map` loop
(SOAP's refreshes loop on CPUs and GPUs: on a GPU the batched QR was slower).

It prints the medians of the repeats, the FLOPs and floors, and the ratios of
medians: Muon / Newton-Schulz floor, NorMuon / floor (target: at most 1.3) and
SOAP amortised / AdamW (target: at most 3).

    python benchmarks/matrix.py              # 10M and 50M (about 10 minutes on CPU)
    python benchmarks/matrix.py --quick      # 0.2M (seconds)
    python benchmarks/matrix.py --sizes 10M --more --repeats 5
    python benchmarks/matrix.py --sizes 10M,50M --matmul-size 1024,8192  # on a GPU
"""

import argparse
import os
import sys
import time
from pathlib import Path


# XLA's CPU matmuls run on its own thread pool; `eigh` and QR call LAPACK (scipy's
# OpenBLAS), whose threads spin-wait: on a shared, oversubscribed machine that made
# `eigh` of a 448x448 matrix take 5 s instead of 50 ms. Set before numpy is imported;
# an explicit OPENBLAS_NUM_THREADS wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (puts the repository root on sys.path)
import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import eqxopt
from eqxopt._matrix import muon as muon_module


def newton_schulz_flops(shapes, ns_steps: int) -> int:
    """FLOPs of the Newton-Schulz iterations of one Muon step on the 2-D leaves of
    `shapes`, counting matmuls only (2 FLOPs per multiply-add).

    `Muon` orthogonalizes each `(out, in)` leaf as an `(m, n)` matrix with `m <= n`
    (`_orthogonalize` transposes tall ones for a batch, and
    `eqxopt._matrix.linalg.newton_schulz` iterates a tall one alone in the tall form,
    with the same products transposed), which runs, per row of the coefficients
    (`ns_steps` rows), on `X` of shape `(m, n)`:

        A = X @ X^H          (m, n) @ (n, m): 2 m^2 n
        A @ A                (m, m) @ (m, m): 2 m^3
        (b A + c A^2) @ X    (m, m) @ (m, n): 2 m^2 n

    i.e. `ns_steps * (4 m^2 n + 2 m^3)` per matrix. The elementwise work (the
    Frobenius normalization, `b A + c A^2`, `a X + ...`: O(m n) per step) is left out:
    it is below 1/m of the matmuls'.
    """
    total = 0
    for s in shapes:
        if len(s) != 2:
            continue
        m, n = sorted(s)
        total += ns_steps * (4 * m * m * n + 2 * m**3)
    return total


def soap_flops(shapes) -> tuple[int, int]:
    """Matmul FLOPs of a regular SOAP step and of its refresh's extra work, for
    2-D leaves `(m, n)` with both axes preconditioned (`m, n <= max_precond_dim`).

    A regular step (`eqxopt.SOAP.update`): project the gradient ($Q_L^\\top G Q_R$:
    `m^2 n + m n^2` multiply-adds), project the Adam direction back (the same), and
    the two Gram matrices ($G G^\\top$, $G^\\top G$: the same again): `6 (m^2 n +
    m n^2)` FLOPs. The refresh (`qr_power_basis` per factor of size `d`: the power
    step `L Q`, whose product also gives the eigenvalue estimate `diag(Q^T L Q)`
    elementwise, a QR; then the momentum rotated back and forth: `4 (m^2 n + m
    n^2)`): about `2 d^3 + 4/3 d^3 * 2` per factor (QR by Householder, `4/3 d^3`
    multiply-adds) plus the rotation.
    """
    regular = refresh = 0
    for s in shapes:
        if len(s) != 2:
            continue
        m, n = s
        regular += 6 * (m * m * n + m * n * n)
        refresh += 4 * (m * m * n + m * n * n)
        refresh += sum(2 * d**3 + 8 * d**3 // 3 for d in (m, n))
    return regular, refresh


def make_step(opt):
    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step


def make_fixed_count_step(opt):
    """A step whose state's count is `count` (not donated) whatever the state says:
    timing it repeatedly times the same kind of step (e.g. SOAP's refresh)."""

    def step(params, state, grads, count):
        state = eqx.tree_at(lambda s: s.count, state, count)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1e3, "M": 1e6, "G": 1e9}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def run_size(n_params, args):
    shapes = C.transformer_shapes(n_params, args.layers)
    params, grads = C.params_and_grads(shapes)
    n_matrices = sum(len(s) == 2 for s in shapes.values())
    d = shapes["layer0.attn.out.weight"][0]
    print(
        f"## {C.human(C.count(shapes))} params: d={d}, {n_matrices} matrices and "
        f"{len(shapes) - n_matrices} vectors (float32); {args.repeats} interleaved "
        f"repeats; Muon on {jax.default_backend()}: "
        f"{'batched' if muon_module._group_same_shapes() else 'per-leaf'} "
        "Newton-Schulz\n"
    )

    compiled = {}
    runners = {}

    def add(name, fn, fn_args, donate, feed=None):
        c = C.compile_step(fn, fn_args, donate)
        compiled[name] = c
        print(f"compiled {name}: {c.seconds:.1f} s", flush=True)
        if feed is None:
            feed = (lambda a, out: (out[0], out[1], *a[2:])) if donate else None
            feed = feed or (lambda a, out: a)
        runners[name] = C.Runner(c.compiled, fn_args, feed)

    def add_opt(name, opt):
        add(
            name,
            make_step(opt),
            (C.fresh_copy(params), opt.init(params), grads),
            (0, 1),
        )

    def add_fixed(name, opt, count):
        state = opt.init(params)
        # One real step first, so that SOAP's state holds its bases (its first step
        # only computes them).
        state = jax.jit(lambda s, g, p: opt.update(g, s, p)[1])(state, grads, params)
        count = jnp.asarray(count, jnp.int32)
        add(
            name,
            make_fixed_count_step(opt),
            (C.fresh_copy(params), state, grads, count),
            (0, 1),
        )

    # The matmul's output is its next input (so that timing blocks on it); `b` is
    # orthogonal, so the values neither grow nor vanish over the calls.
    for n in args.matmul_size:
        a = C.random_array(1, (n, n))
        b, _ = jnp.linalg.qr(C.random_array(2, (n, n)))
        add(f"matmul {n}", lambda a, b: (a @ b, b), (a, b), (0,))

    add_opt("AdamW", eqxopt.AdamW(1e-3))
    muon, normuon = eqxopt.Muon(0.02), eqxopt.NorMuon(0.02)
    add_opt("Muon", muon)
    add_opt("NorMuon", normuon)
    soap = eqxopt.SOAP(3e-3, precondition_frequency=10)
    if args.soap:
        add_fixed("SOAP (regular)", soap, 11)
        add_fixed("SOAP (refresh)", soap, 10)
    soap_direct = args.soap_direct
    if soap_direct is None:
        soap_direct = n_params <= 1_000_000
    if soap_direct and args.soap:
        add_opt("SOAP (10 steps)", soap)
    if args.more:
        shampoo = eqxopt.Shampoo(1e-3, preconditioning_compute_steps=10)
        add_fixed("Shampoo (regular)", shampoo, 11)
        add_fixed("Shampoo (refresh)", shampoo, 10)
        add_opt("Kron", eqxopt.Kron(1e-3))

    for name, c in compiled.items():
        if c.unusable_donations:
            print(f"warning: {name}: {c.unusable_donations} unusable donations")

    # Repeats last about `min_seconds`; `SOAP (10 steps)` makes a multiple of 10
    # calls per repeat (each repeat then holds exactly one refresh).
    times = C.interleaved(
        {k: r for k, r in runners.items() if k != "SOAP (10 steps)"},
        args.repeats,
        min_seconds=args.min_seconds,
        warmup=1,
    )
    if "SOAP (10 steps)" in runners:
        runner = runners["SOAP (10 steps)"]
        runner.run(10)  # the first step (eigh) and one refresh, compiled and warm
        times["SOAP (10 steps)"] = [runner.run(10) for _ in range(args.repeats)]
    med = {name: C.median(ts) for name, ts in times.items()}

    # The floor takes the fastest of the measured matmul rates.
    rates = {n: 2 * n**3 / med[f"matmul {n}"] for n in args.matmul_size}
    matmul_rate = max(rates.values())
    ns_steps = muon.init(params).ns_coeffs.shape[0]
    ns = newton_schulz_flops(shapes.values(), ns_steps)
    floor = ns / matmul_rate
    soap_amortised = (
        (9 * med["SOAP (regular)"] + med["SOAP (refresh)"]) / 10 if args.soap else 0.0
    )
    soap_regular_flops, soap_refresh_flops = soap_flops(shapes.values())
    soap_floor = (soap_regular_flops + soap_refresh_flops / 10) / matmul_rate

    rows = []
    for name in times:
        rows.append(
            [
                name,
                f"{med[name] * 1e3:.2f}",
                f"{min(times[name]) * 1e3:.2f}",
                f"{compiled[name].seconds:.2f}" if name in compiled else "-",
            ]
        )
    print(C.table(["step", "median ms", "min ms", "compile s"], rows))
    print()
    for n, rate in rates.items():
        print(f"matmul rate: {rate / 1e9:.1f} GFLOP/s ({n}x{n} float32 matmul, median)")
    print(
        f"Newton-Schulz: {ns / 1e9:.2f} GFLOP per step ({ns_steps} iterations); "
        f"floor {floor * 1e3:.1f} ms"
    )
    out = {"params": C.count(shapes), "matmul_gflops": matmul_rate / 1e9}
    for name in ("Muon", "NorMuon"):
        r = C.ratio(med[name], floor)
        out[name] = r
        print(f"{name} / Newton-Schulz floor: {r:.2f} (target <= 1.3)")
    if not args.soap:
        print()
        return out
    print(
        f"SOAP amortised step (9 regular + 1 refresh) / 10: {soap_amortised * 1e3:.1f} "
        f"ms; SOAP's own matmul floor (about {soap_regular_flops / 1e9:.2f} GFLOP per "
        f"step + {soap_refresh_flops / 1e9:.2f} per refresh, over the matmul rate): "
        f"{soap_floor * 1e3:.1f} ms"
    )
    r = C.ratio(soap_amortised, med["AdamW"])
    out["SOAP/AdamW"] = r
    print(f"SOAP amortised / AdamW: {r:.2f} (target <= 3)")
    r = C.ratio(soap_amortised, soap_floor)
    print(f"SOAP amortised / SOAP's matmul floor: {r:.2f}")
    if "SOAP (10 steps)" in med:
        r = C.ratio(med["SOAP (10 steps)"], med["AdamW"])
        print(
            f"SOAP over 10 real steps: {med['SOAP (10 steps)'] * 1e3:.1f} ms per step; "
            f"/ AdamW: {r:.2f}"
        )
    if args.more:
        shampoo_amortised = (
            9 * med["Shampoo (regular)"] + med["Shampoo (refresh)"]
        ) / 10
        print(
            f"Shampoo amortised / AdamW: {C.ratio(shampoo_amortised, med['AdamW']):.2f}"
            f"; Kron / AdamW: {C.ratio(med['Kron'], med['AdamW']):.2f}"
        )
    print()
    return out


def decomposition_times(sizes, batch: int, repeats: int) -> None:
    """QR and `eigh` of `(n, n)` float32 matrices: one alone, and a stack of `batch`
    mapped by `jax.vmap` (a batched kernel) or by `lax.map` (a loop), in ms per
    matrix (medians of `repeats` calls, each blocked on). SOAP's refreshes map their
    stacks by a loop on CPUs and GPUs (`eqxopt._matrix.spread.batched_kernels`) on the
    strength of these figures."""
    qr = lambda x: jnp.linalg.qr(x)[0]
    eigh = lambda x: jnp.linalg.eigh(x)[1]
    rows = []
    for n in sizes:
        a = C.random_array(3, (n, n))
        sym = a @ a.T / n
        stack = jnp.stack([a] * batch)
        contenders = {
            "qr": (qr, a, 1),
            "qr vmap": (jax.vmap(qr), stack, batch),
            "qr loop": (lambda x: jax.lax.map(qr, x), stack, batch),
            "eigh": (eigh, sym, 1),
        }
        row = [n]
        for fn, x, count in contenders.values():
            f = jax.jit(fn)
            jax.block_until_ready(f(x))
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(f(x))
                ts.append(time.perf_counter() - t0)
            row.append(f"{C.median(ts) / count * 1e3:.2f}")
        rows.append(row)
    print(f"QR and eigh, ms per matrix (stacks of {batch}; float32):\n")
    print(C.table(["n", "qr", "qr vmap", "qr loop", "eigh"], rows))
    print()


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one small tree (CI)")
    parser.add_argument("--sizes", default=None, help="e.g. 10M,50M")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--matmul-size",
        default=None,
        help="comma-separated sizes N of the reference matmul; the floor takes the "
        "fastest rate (default 1024; on a GPU try 1024,8192)",
    )
    # Repeats of the fast contenders (the matmul, AdamW) last this long, so that the
    # matmul rate is not taken from a moment's load while a Muon step lasts seconds
    # (default 0.5; `--quick`, which only checks that the script runs, 0.02).
    parser.add_argument("--min-seconds", type=float, default=None)
    parser.add_argument(
        "--soap-direct",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also time repeats of 10 real SOAP steps (default: at or below 1M)",
    )
    parser.add_argument("--more", action="store_true", help="Shampoo and Kron too")
    parser.add_argument(
        "--decompositions",
        default=None,
        help="comma-separated n: time QR and eigh of (n, n) matrices, alone and in "
        "stacks (default with --quick: 16,32; else none)",
    )
    parser.add_argument(
        "--no-soap", dest="soap", action="store_false", help="leave SOAP out"
    )
    parser.add_argument(
        "--layers", type=int, default=None, help="transformer layers (default 5)"
    )
    args = parser.parse_args()
    sizes = args.sizes or ("200K" if args.quick else "10M,50M")
    args.repeats = args.repeats or 3
    if args.min_seconds is None:
        args.min_seconds = 0.02 if args.quick else 0.5
    sizes_text = args.matmul_size or ("256" if args.quick else "1024")
    args.matmul_size = [int(n) for n in sizes_text.split(",")]
    args.layers = args.layers or (1 if args.quick else 5)

    print(C.machine_line(C.machine_info()))
    print(f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}\n")
    decompositions = args.decompositions or ("16,32" if args.quick else None)
    if decompositions:
        sizes_n = [int(n) for n in decompositions.split(",")]
        decomposition_times(sizes_n, batch=5, repeats=args.repeats * 3)
        if args.sizes is None and not args.quick:
            return
    for size in sizes.split(","):
        run_size(parse_size(size), args)


if __name__ == "__main__":
    main()
