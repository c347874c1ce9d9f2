"""Muon step time: eqxopt against `optax.contrib.muon`, and Newton-Schulz's share.

On a transformer-like tree in Equinox's `(out, in)` layout (per block an up-projection
`(4d, d)`, a down-projection `(d, 4d)` and a layer norm's scale and bias; default 12
blocks at d = 512, i.e. 24 matrices of 512x2048 / 2048x512 and 48 vectors), this
script measures in one process, interleaved (A B C, C B A, ...), with jitted steps
that donate params and state:

- `eqxopt`: `eqxopt.Muon` as it is (one Newton-Schulz per leaf on CPU; same-shape
  matrices batched into one on accelerators);
- `eqxopt batched` (on CPU) or `eqxopt per-leaf` (elsewhere): the other choice;
- `optax`: `optax.contrib.muon` with dimension numbers for the `(out, in)` layout
  (same work: 5 Newton-Schulz steps per matrix, AdamW on the vectors);
- `eqxopt without NS`: the eqxopt step with the Newton-Schulz iterations skipped
  (normalization only); Newton-Schulz's share of the step is `1 - this / eqxopt`;
- `NS only`: eqxopt's Newton-Schulz on the gradients alone (not donated).

It prints the medians of the repeats and the ratio eqxopt / Optax (below 1: eqxopt
faster). Both sides use their defaults otherwise (Nesterov on; eqxopt's momentum has
no bias correction, Optax's has: the same cost).

    python benchmarks/muon.py            # 12 blocks at d = 512 (a few minutes on CPU)
    python benchmarks/muon.py --quick    # 2 blocks at d = 64 (seconds)
    python benchmarks/muon.py --blocks 6 --width 256 --repeats 9
"""

import argparse
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (puts the repository root on sys.path)
import jax
import jax.tree_util as jtu
import optax

import eqxopt
from eqxopt._matrix import muon as muon_module


STANDARD = lambda: jax.numpy_dtype_promotion("standard")  # Optax is not strict-clean


def tree_shapes(blocks: int, width: int) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for i in range(blocks):
        shapes[f"block{i}.up.weight"] = (4 * width, width)  # (out, in): tall
        shapes[f"block{i}.down.weight"] = (width, 4 * width)  # wide
        shapes[f"block{i}.norm.scale"] = (width,)
        shapes[f"block{i}.norm.bias"] = (width,)
    return shapes


def optax_dims(params):
    dims = optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=0)
    return jtu.tree_map(lambda p: dims if p.ndim == 2 else None, params)


def make_step(opt, context=None):
    def step(params, state, grads):
        if context is None:
            updates, state = opt.update(grads, state, params)
        else:
            with context():
                updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a small tree (CI)")
    parser.add_argument("--blocks", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    blocks = args.blocks or (2 if args.quick else 12)
    width = args.width or (64 if args.quick else 512)
    repeats = args.repeats or (5 if args.quick else 7)

    print(C.machine_line(C.machine_info()))
    shapes = tree_shapes(blocks, width)
    params, grads = C.params_and_grads(shapes)
    n_matrices = sum(len(s) == 2 for s in shapes.values())
    print(
        f"tree: {blocks} blocks at d={width}: {n_matrices} matrices, "
        f"{len(shapes) - n_matrices} vectors, {C.human(C.count(shapes))} params "
        f"(float32); {repeats} interleaved repeats\n"
    )

    lr = 0.02
    ours = eqxopt.Muon(lr)
    ref = optax.contrib.muon(lr, muon_weight_dimension_numbers=optax_dims)

    compiled = {}
    runners = {}

    def add(name, fn, args, donate, context=None, feed=None):
        c = C.compile_step(fn, args, donate, context)
        compiled[name] = c
        if feed is None:
            feed = lambda a, out: (out[0], out[1], a[2])
        runners[name] = C.Runner(c.compiled, args, feed)

    coeffs = ours.init(params).ns_coeffs  # for "NS only" (the states are donated)
    add(
        "eqxopt",
        make_step(ours),
        (C.fresh_copy(params), ours.init(params), grads),
        (0, 1),
    )
    # The default batches same-shape matrices on accelerators only; time the other
    # choice too.
    batched = not muon_module._group_same_shapes()
    other = "eqxopt batched" if batched else "eqxopt per-leaf"
    muon_module._GROUP_SAME_SHAPES = batched
    try:
        add(
            other,
            make_step(ours),
            (C.fresh_copy(params), ours.init(params), grads),
            (0, 1),
        )
    finally:
        muon_module._GROUP_SAME_SHAPES = None
    with STANDARD():
        ref_state = ref.init(params)
    add(
        "optax",
        make_step(ref, STANDARD),
        (C.fresh_copy(params), ref_state, grads),
        (0, 1),
        STANDARD(),
    )

    # The same step with the Newton-Schulz iterations replaced by the normalization
    # alone: the step time it saves is Newton-Schulz's share.
    newton_schulz = muon_module._newton_schulz
    muon_module._newton_schulz = lambda x, coeffs, eps, ns_dtype: newton_schulz(
        x, coeffs[:0], eps, ns_dtype
    )
    try:
        add(
            "eqxopt without NS",
            make_step(ours),
            (C.fresh_copy(params), ours.init(params), grads),
            (0, 1),
        )
    finally:
        muon_module._newton_schulz = newton_schulz

    matrices = {k: g for k, g in grads.items() if g.ndim == 2}

    def ns_only(matrices, coeffs):
        mats: list = [
            muon_module._as_matrix(True, g, k) for k, g in matrices.items()
        ]  # the (out, in) view Muon uses
        outputs = muon_module._orthogonalize(
            list(matrices.values()), mats, coeffs, ours.eps, None, None
        )  # ns_dtype, spread: the defaults
        return dict(zip(matrices, outputs))

    # Its outputs (orthogonal matrices, which cost the same) are its next inputs: the
    # runner blocks on its arguments, so they must depend on the previous call.
    add(
        "NS only",
        ns_only,
        (matrices, coeffs),
        (),
        feed=lambda a, out: (out, a[1]),
    )

    for name, c in compiled.items():
        if c.unusable_donations:
            print(f"warning: {name}: {c.unusable_donations} unusable donations")
    times = C.interleaved(runners, repeats, min_seconds=0.05)
    med = {name: C.median(ts) for name, ts in times.items()}
    rows = []
    for name in runners:
        rows.append(
            [
                name,
                f"{med[name] * 1e3:.2f}",
                f"{min(times[name]) * 1e3:.2f}",
                f"{compiled[name].seconds:.2f}",
                C.fmt(C.ratio(med[name], med["optax"])),
            ]
        )
    print(C.table(["step", "median ms", "min ms", "compile s", "ratio to optax"], rows))
    print()
    print(f"ratio eqxopt / optax (medians): {C.ratio(med['eqxopt'], med['optax']):.3f}")
    print(f"ratio {other} / optax: {C.ratio(med[other], med['optax']):.3f}")
    share = 1 - C.ratio(med["eqxopt without NS"], med["eqxopt"])
    print(
        f"Newton-Schulz share of the eqxopt step: {share:.0%} (1 - step without NS / "
        f"step); NS alone / step: {C.ratio(med['NS only'], med['eqxopt']):.0%}"
    )


if __name__ == "__main__":
    main()
