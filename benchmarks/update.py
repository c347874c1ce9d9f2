"""Jitted, donated optimizer steps: eqxopt against Optax and the bandwidth floor.

For every registry entry (`tests/registry/*.py`, collected by `tests/helpers.py`),
against its Optax reference where it has one, on a transformer-like tree (63 leaves)
and on one flat vector, at about 1M, 10M and 50M float32 parameters, this script
measures in one process:

- the step time (`update` + apply, donated params and state, `jax.jit`), interleaved
  eqxopt / Optax / floor, medians of the repeats and the ratio eqxopt/Optax;
- the bandwidth floor: one jitted elementwise function moving AdamW's bytes (reads p,
  g, m, v; writes p, m, v; donated), on the flat vector ("flat floor") and leaf by
  leaf on the tree ("tree floor"), and each optimizer's ratio to the flat floor;
- trace+compile time of the step on the 1M tree (`jax.jit(...).lower(...).compile()`,
  fresh function each time, state checks ON; the trace with checks OFF too);
- the peak memory of the compiled donated step (`compiled.memory_analysis()`), and any
  `copy` of a param-sized buffer in its optimized HLO (`compiled.as_text()`);
- unusable donations (a state buffer that the step cannot update in place);
- an experiment: AdamW on the tree updated as one flat buffer (concatenated grads and
  params, flat moments), against AdamW leaf by leaf and the two floors.

    python benchmarks/update.py                # full sweep (about 15 minutes)
    python benchmarks/update.py --quick        # 1M only, a few entries (smoke test)
    python benchmarks/update.py --only 'adamw|lion' --sizes 1M,10M --json out.json
    python benchmarks/update.py --from-json benchmarks/results/cpu.json --plot

The registry's params are tiny and its masks/labels are trees shaped like them. So
that every entry runs unchanged, the benchmark params keep the entry's own top-level
structure: the 63 transformer leaves are split into as many groups as the entry's
params have leaves, and each group replaces one leaf (as a dict); a mask or label tree
is then a prefix of the benchmark params, as Equinox filter specs and Optax masks
allow. The flat vector sits at the first leaf position, with `None` at the others (or,
for entries that need every position filled, the entry's own tiny registry leaves).
"""

import argparse
import gc
import json
import math
import os
import re
import sys
import time
import traceback
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (puts the repository root on sys.path)
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax

from tests.helpers import CASES, SHAPES


SIZES = {"1M": 1_000_000, "10M": 10_000_000, "50M": 50_000_000}
KINDS = ("tree", "flat")
QUICK_IDS = ("adamw", "multisteps3_adam")
# AdamW's traffic per parameter: read p, g, m, v and write p, m, v, 4 bytes each.
FLOOR_BYTES = 28
STANDARD = lambda: jax.numpy_dtype_promotion("standard")  # Optax is not strict-clean

# Targets of the performance issue (benchmark figures, not tests).
FLOOR_TARGETS = {"lion": 1.5, "multisteps3_adam": 1.5, "adafactor": 1.5}
TREE_TARGET = 1.3  # AdamW on the tree at 1M, against the flat floor
COMPILE_TARGET = 1.2


# --- params -----------------------------------------------------------------------


def _is_shape(x):
    return isinstance(x, tuple) and all(isinstance(i, int) for i in x)


def layout(case_shapes, kind: str, shapes: dict, tiny: bool = False):
    """The benchmark params' layout for an entry: the entry's own structure with each
    leaf replaced by a group of transformer leaves (`tree`), or by the flat vector at
    the first leaf and `None` elsewhere (`flat`; with `tiny`, the entry's own small
    registry leaves elsewhere, for entries that need every position filled, e.g. a
    `Partition` whose labels must all get a leaf). Groups are lists of
    `(name, shape)`, `None`, or `("tiny", shape)`."""
    structure = SHAPES if case_shapes is None else case_shapes
    positions, treedef = jtu.tree_flatten(structure, is_leaf=_is_shape)
    names = list(shapes)
    if kind == "flat":
        rest = [("tiny", tuple(s)) if tiny else None for s in positions[1:]]
        groups = [[("flat", (C.count(shapes),))]] + rest
    else:
        split = np.array_split(np.arange(len(names)), len(positions))
        groups = [[(names[i], shapes[names[i]]) for i in idx] for idx in split]
    return treedef, groups


def build(treedef, groups, base: dict, seed: int = 0):
    """Params from a layout, each leaf a fresh copy of `base[name]`."""

    def leaf(i, g):
        if g is None:
            return None
        if isinstance(g, tuple):
            return C.random_array(seed * 1000 + i, g[1])
        return {n: jnp.array(base[n], copy=True) for n, _ in g}

    return jtu.tree_unflatten(treedef, [leaf(i, g) for i, g in enumerate(groups)])


def base_arrays(shapes: dict, kind: str, seed: int):
    if kind == "flat":
        return {"flat": C.random_array(seed, (C.count(shapes),))}
    return {
        n: C.random_array(seed * 1000 + i, s) for i, (n, s) in enumerate(shapes.items())
    }


def leaf_shapes(tree):
    return [tuple(x.shape) for x in jtu.tree_leaves(tree)]


# --- steps ------------------------------------------------------------------------


def ours_step(opt, static_extra):
    def step(p, g, s, extra):
        return opt.step(p, g, s, **eqx.combine(extra, static_extra))

    return step


def optax_step(tx, static_extra):
    def step(p, g, s, extra):
        u, s = tx.update(g, s, p, **eqx.combine(extra, static_extra))
        return optax.apply_updates(p, u), s

    return step


def _feed(args, out):
    p, g, s, e = args
    return (out[0], g, out[1], e)


def floor_leaf(p, g, m, v):
    """AdamW's elementwise traffic (read p, g, m, v; write p, m, v), nothing else."""
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * (g * g)
    p = p - 1e-3 * (m / (jnp.sqrt(v) + 1e-8) + 1e-4 * p)
    return p, m, v


def floor_fn(p, g, m, v):
    out = jtu.tree_map(floor_leaf, p, g, m, v)
    is_out = lambda x: isinstance(x, tuple)
    return tuple(jtu.tree_map(lambda o: o[i], out, is_leaf=is_out) for i in range(3))


def floor_runner(params: dict):
    p = C.fresh_copy(params)
    g = jtu.tree_map(lambda x: x * 0.5, params)
    m, v = jtu.tree_map(jnp.zeros_like, p), jtu.tree_map(jnp.zeros_like, p)
    compiled = C.compile_step(floor_fn, (p, g, m, v), (0, 2, 3))
    return C.Runner(
        compiled.compiled,
        (p, g, m, v),
        lambda args, out: (out[0], args[1], out[1], out[2]),
    ), compiled


def flattened_adamw_step(opt):
    """AdamW updated as ONE flat buffer (the "many small leaves as one buffer"
    option): concatenate the grads and params, update the flat state, split the
    update back into leaves."""

    def step(p, g, s):
        leaves, treedef = jtu.tree_flatten(p)
        flat_g = jnp.concatenate([x.ravel() for x in jtu.tree_leaves(g)])
        flat_p = jnp.concatenate([x.ravel() for x in leaves])
        u, s = opt.update(flat_g, s, flat_p)
        offsets = np.cumsum([0] + [x.size for x in leaves])
        new = [
            x + u[a:b].reshape(x.shape)
            for x, a, b in zip(leaves, offsets[:-1], offsets[1:])
        ]
        return jtu.tree_unflatten(treedef, new), s

    return step


def flat_buffer_experiment(shapes, base, grads_base, floors, repeats, min_seconds):
    """eqxopt AdamW on the tree leaf by leaf, against the same AdamW updated as one
    flat buffer, and the flat and tree floors, interleaved."""
    import eqxopt

    opt = eqxopt.AdamW(1e-3, weight_decay=0.1)
    n = C.count(shapes)
    grads = C.fresh_copy(grads_base)
    runners = {}
    p = C.fresh_copy(base)
    c = C.compile_step(
        lambda p, g, s: opt.step(p, g, s), (p, grads, opt.init(p)), (0, 2)
    )
    runners["per leaf"] = C.Runner(c.compiled, (p, grads, opt.init(p)), _feed3)
    p = C.fresh_copy(base)
    s = opt.init(jnp.zeros((n,), jnp.float32))
    c = C.compile_step(flattened_adamw_step(opt), (p, grads, s), (0, 2))
    runners["flattened"] = C.Runner(c.compiled, (p, grads, s), _feed3)
    out = {"flattened memory": C.memory(c.compiled)}
    runners["flat floor"] = floors["flat"]
    runners["tree floor"] = floors["tree"]
    times = C.interleaved(runners, repeats, min_seconds)
    out.update({name: C.median(ts) for name, ts in times.items()})
    return out


def _feed3(args, out):
    return (out[0], args[1], out[1])


def cycle(opt) -> int:
    """Calls per repeat must be a multiple of this: a gradient-accumulation window
    (`MultiSteps`), so that a repeat averages whole windows."""
    k = getattr(opt, "every_k", None)
    if isinstance(k, int) and not isinstance(k, bool):
        return k
    return 6 if k is not None else 1


class CycleRunner(C.Runner):
    def __init__(self, runner: C.Runner, k: int):
        super().__init__(runner.step, runner.args, runner.feed)
        self.k = k

    def run(self, n: int) -> float:
        return super().run(self.k * max(1, math.ceil(n / self.k)))


def shared_buffers(params, state) -> int:
    """How many state leaves share a buffer with a param or another state leaf.
    Donating both params and such a state fails ("Attempt to donate the same buffer
    twice"): a training step that donates them cannot take this state as `init`
    returned it."""
    seen, shared = set(), 0
    for x in jtu.tree_leaves(params):
        if isinstance(x, jax.Array):
            seen.add(x.unsafe_buffer_pointer())
    for x in jtu.tree_leaves(state):
        if isinstance(x, jax.Array) and x.size:
            ptr = x.unsafe_buffer_pointer()
            shared += ptr in seen
            seen.add(ptr)
    return shared


def make_runner(step_fn, p, g, s, extra, context=None, k=1):
    dyn, static = eqx.partition(extra, eqx.is_array)
    shared = shared_buffers(p, s)
    if shared:
        s = C.fresh_copy(s)  # so that the donated step can run at all
    compiled = C.compile_step(step_fn(static), (p, g, s, dyn), (0, 2), context)
    compiled.shared_buffers = shared
    runner = C.Runner(compiled.compiled, (p, g, s, dyn), _feed)
    return (CycleRunner(runner, k) if k > 1 else runner), compiled


def describe_compiled(compiled: C.Compiled, shapes) -> dict:
    return {
        "lower_s": compiled.lower_seconds,
        "compile_s": compiled.compile_seconds,
        "memory": C.memory(compiled.compiled),
        "copies": C.param_sized_copies(compiled.compiled.as_text(), shapes),
        "unusable_donations": compiled.unusable_donations,
        "shared_buffers": getattr(compiled, "shared_buffers", 0),
    }


# --- one entry at one size --------------------------------------------------------


def measure(
    case, kind, shapes, base, grads_base, floor, repeats, min_seconds, max_s, timing
):
    try:
        return _measure(
            case,
            kind,
            shapes,
            base,
            grads_base,
            floor,
            repeats,
            min_seconds,
            max_s,
            timing,
            tiny=False,
        )
    except Exception:
        if kind != "flat":
            raise
    result = _measure(
        case,
        kind,
        shapes,
        base,
        grads_base,
        floor,
        repeats,
        min_seconds,
        max_s,
        timing,
        tiny=True,
    )
    result["layout"] = "flat vector + the entry's tiny registry leaves"
    return result


def _measure(
    case,
    kind,
    shapes,
    base,
    grads_base,
    floor,
    repeats,
    min_seconds,
    max_s,
    timing,
    tiny,
):
    treedef, groups = layout(case.shapes, kind, shapes, tiny)
    result = {"id": case.id, "kind": kind}
    params = build(treedef, groups, base, seed=0)
    grads = build(treedef, groups, grads_base, seed=1)
    extra = {} if case.extra is None else case.extra(params)
    shapes_here = leaf_shapes(params)

    opt = case.make()
    k = cycle(opt)
    s = opt.init(params)
    ours, c_ours = make_runner(
        lambda st: ours_step(opt, st), params, grads, s, extra, k=k
    )
    result["ours"] = describe_compiled(c_ours, shapes_here)
    runners = {"ours": ours}
    if case.reference is not None:
        tx = case.reference()
        p_ref = build(treedef, groups, base, seed=0)
        with STANDARD():
            s_ref = tx.init(p_ref)
        ref, c_ref = make_runner(
            lambda st: optax_step(tx, st), p_ref, grads, s_ref, extra, STANDARD(), k
        )
        result["optax"] = describe_compiled(c_ref, shapes_here)
        runners["optax"] = ref
    if not timing:
        return result
    # One call of each first: a step that is far too slow for a sweep (matmul-bound,
    # e.g. Muon at 50M) is reported as such instead of being timed.
    first = {name: r.run(1) for name, r in runners.items()}
    if max(first.values()) > max_s:
        result["skipped"] = (
            f"one step took {max(first.values()):.1f} s (> {max_s} s); not timed"
        )
        return result
    runners["floor"] = floor
    times = C.interleaved(runners, repeats, min_seconds, warmup=1)
    for name, ts in times.items():
        result.setdefault(name, {})
        result[name]["times"] = ts
        result[name]["median"] = C.median(ts)
    return result


def compile_times(case, shapes, rounds: int, first: dict | None) -> dict:
    """Trace+compile of the step on the tree, `rounds` interleaved rounds of fresh
    functions: eqxopt with state checks on (lower + compile), eqxopt with checks off
    (lower only: the compiled program is the same), Optax (lower + compile). `first`
    is the entry's timing run on this tree, whose compiles count as one more round."""
    treedef, groups = layout(case.shapes, "tree", shapes)
    zeros = {n: jax.ShapeDtypeStruct(s, jnp.float32) for n, s in shapes.items()}
    leaves = [None if g is None else {n: zeros[n] for n, _ in g} for g in groups]
    params = jtu.tree_unflatten(treedef, leaves)
    out = {"ours": [], "ours_lower": [], "ours_lower_nocheck": [], "optax": []}
    if first and "ours" in first:
        out["ours"].append(first["ours"]["lower_s"] + first["ours"]["compile_s"])
        out["ours_lower"].append(first["ours"]["lower_s"])
        if first.get("optax"):
            out["optax"].append(first["optax"]["lower_s"] + first["optax"]["compile_s"])
    if rounds == 0:
        return {name: C.median(v) for name, v in out.items()} | {"samples": out}
    concrete = None
    if case.extra is not None:
        concrete = jtu.tree_map(
            lambda x: jnp.zeros(x.shape, x.dtype), params, is_leaf=lambda x: x is None
        )
    extra = {} if case.extra is None else case.extra(concrete)
    dyn, static = eqx.partition(extra, eqx.is_array)
    dyn = C.abstract(dyn)
    s = jax.eval_shape(case.make().init, params)
    s_ref = None
    if case.reference is not None:
        with STANDARD():
            s_ref = jax.eval_shape(case.reference().init, params)
    previous = os.environ.get("EQXOPT_CHECK_STATE")
    try:
        for r in range(rounds):
            order = ("ours", "nocheck", "optax") if r % 2 == 0 else ("optax", "ours")
            for side in order:
                if side == "optax" and s_ref is not None:
                    tx = case.reference()
                    with STANDARD():  # a reference may build itself in `init`
                        jax.eval_shape(tx.init, params)
                    c = C.compile_step(
                        optax_step(tx, static),
                        (params, params, s_ref, dyn),
                        (0, 2),
                        STANDARD(),
                    )
                    out["optax"].append(c.seconds)
                elif side == "ours":
                    os.environ["EQXOPT_CHECK_STATE"] = "1"
                    c = C.compile_step(
                        ours_step(case.make(), static), (params, params, s, dyn), (0, 2)
                    )
                    out["ours"].append(c.seconds)
                    out["ours_lower"].append(c.lower_seconds)
                elif side == "nocheck":
                    os.environ["EQXOPT_CHECK_STATE"] = "0"
                    fn = ours_step(case.make(), static)
                    t0 = time.perf_counter()
                    jax.jit(fn, donate_argnums=(0, 2)).lower(params, params, s, dyn)
                    out["ours_lower_nocheck"].append(time.perf_counter() - t0)
    finally:
        if previous is None:
            os.environ.pop("EQXOPT_CHECK_STATE", None)
        else:
            os.environ["EQXOPT_CHECK_STATE"] = previous
    return {name: C.median(v) for name, v in out.items()} | {"samples": out}


# --- reporting ----------------------------------------------------------------------


def _ms(x):
    return None if x is None or not math.isfinite(x) else 1e3 * x


def step_tables(results: dict) -> str:
    out = []
    for size, per in results["sizes"].items():
        floors = per["floors"]
        out.append(
            f"#### {size} parameters ({C.human(per['n_params'])}; flat floor "
            f"{_ms(floors['flat']):.3f} ms, tree floor {_ms(floors['tree']):.3f} ms)\n"
        )
        rows = []
        for entry_id, kinds in per["entries"].items():
            starred = any(kinds.get(k, {}).get("layout") for k in KINDS)
            row = [entry_id + (" *" if starred else "")]
            for kind in KINDS:
                r = kinds.get(kind, {})
                ours = r.get("ours", {}).get("median")
                ref = r.get("optax", {}).get("median")
                fl = r.get("floor", {}).get("median")
                if "skipped" in r or "error" in r:
                    row += ["skipped" if "skipped" in r else "error", "", "", ""]
                    continue
                row += [
                    _ms(ours),
                    C.ratio(ours, ref) if ref else None,
                    C.ratio(ours, fl) if ours else None,
                    C.ratio(ref, fl) if ref else None,
                ]
            rows.append(row)
        headers = ["entry"]
        for kind in KINDS:
            headers += [
                f"{kind} ms",
                f"{kind} /optax",
                f"{kind} /floor",
                "optax /floor",
            ]
        out.append(C.table(headers, rows))
        out.append("")
    out.append(
        "`*`: the flat run keeps the entry's other (tiny) registry leaves next to "
        "the flat vector, because the entry needs every position filled (e.g. a "
        "`Partition` whose labels must all get a leaf).\n"
    )
    return "\n".join(out)


def floor_table(results: dict) -> str:
    rows = []
    for size, per in results["sizes"].items():
        f = per["floors"]
        rows.append(
            [
                size,
                C.human(per["n_params"]),
                f"{_ms(f['flat']):.3f}",
                f"{FLOOR_BYTES * per['n_params'] / f['flat'] / 1e9:.1f}",
                f"{_ms(f['tree']):.3f}",
                C.ratio(f["tree"], f["flat"]),
            ]
        )
    return C.table(
        [
            "size",
            "params",
            "flat floor ms",
            "GB/s (28 B/param)",
            "tree floor ms",
            "tree/flat",
        ],
        rows,
    )


def flat_buffer_table(results: dict) -> str:
    rows = []
    for size, per in results["sizes"].items():
        fb = per.get("flat_buffer")
        if not fb:
            continue
        fl = fb["flat floor"]
        rows.append(
            [
                size,
                C.ratio(fb["per leaf"], fl),
                C.ratio(fb["flattened"], fl),
                C.ratio(fb["tree floor"], fl),
                C.ratio(fb["flattened"], fb["per leaf"]),
            ]
        )
    if not rows:
        return ""
    return C.table(
        [
            "size",
            "AdamW per leaf /floor",
            "AdamW as one buffer /floor",
            "tree floor /floor",
            "one buffer / per leaf",
        ],
        rows,
    )


def _has_optax(c: dict) -> bool:
    """Whether a trace+compile record has Optax's time (no reference: no samples,
    median NaN; results rebuilt from the tables keep no samples: `None`)."""
    return c.get("optax") is not None and math.isfinite(c["optax"])


def compile_table(results: dict) -> str:
    rows = []
    for entry_id, c in results.get("compile", {}).items():
        if "error" in c:
            rows.append([entry_id, "error", "", "", "", ""])
            continue
        rows.append(
            [
                entry_id,
                c["ours"],
                c["ours_lower"],
                c["ours_lower_nocheck"],
                c["optax"] if _has_optax(c) else None,
                C.ratio(c["ours"], c["optax"]) if _has_optax(c) else None,
            ]
        )
    return C.table(
        [
            "entry",
            "eqxopt s",
            "trace s (checks on)",
            "trace s (checks off)",
            "optax s",
            "eqxopt/optax",
        ],
        rows,
    )


def memory_table(results: dict) -> str:
    size = list(results["sizes"])[-1]
    per = results["sizes"][size]
    rows = []
    for entry_id, kinds in per["entries"].items():
        for kind in KINDS:
            r = kinds.get(kind)
            if not r or "error" in r:
                continue
            mo = (r.get("ours") or {}).get("memory") or {}
            mr = (r.get("optax") or {}).get("memory") or {}
            rows.append(
                [
                    entry_id,
                    kind,
                    mo.get("peak", 0) / 2**20 if mo else None,
                    mr.get("peak", 0) / 2**20 if mr else None,
                    C.ratio(mo.get("peak", math.nan), mr.get("peak", math.nan)),
                    mo.get("temp", 0) / 2**20 if mo else None,
                    mr.get("temp", 0) / 2**20 if mr else None,
                ]
            )
    return f"Peak memory of the donated step at {size}:\n\n" + C.table(
        [
            "entry",
            "kind",
            "eqxopt MB",
            "optax MB",
            "ratio",
            "eqxopt temp MB",
            "optax temp MB",
        ],
        rows,
    )


def _n_copies(d: dict) -> int:
    """Param-sized copies of one compiled step (`copies_total` where the results were
    rebuilt from a table that printed the first three names only)."""
    return d.get("copies_total", len(d.get("copies", [])))


def copies_table(results: dict) -> str:
    rows = []
    for size, per in results["sizes"].items():
        for entry_id, kinds in per["entries"].items():
            for kind, r in kinds.items():
                for side in ("ours", "optax"):
                    d = r.get(side) or {}
                    if (
                        d.get("copies")
                        or d.get("unusable_donations")
                        or d.get("shared_buffers")
                    ):
                        rows.append(
                            [
                                size,
                                kind,
                                entry_id,
                                "eqxopt" if side == "ours" else "optax",
                                _n_copies(d),
                                ", ".join(d.get("copies", [])[:3])
                                + (" ..." if _n_copies(d) > 3 else ""),
                                d.get("unusable_donations", 0),
                                d.get("shared_buffers", 0),
                            ]
                        )
    if not rows:
        return (
            "No param-sized copies, unusable donations or shared buffers, in any step."
        )
    return C.table(
        [
            "size",
            "kind",
            "entry",
            "side",
            "copies",
            "first copies",
            "unusable donations",
            "state leaves sharing a buffer",
        ],
        rows,
    )


def errors_table(results: dict) -> str:
    rows = []
    for size, per in results["sizes"].items():
        for entry_id, kinds in per["entries"].items():
            for kind, r in kinds.items():
                if "error" in r or "skipped" in r:
                    rows.append([size, kind, entry_id, r.get("error") or r["skipped"]])
    for entry_id, c in results.get("compile", {}).items():
        if "error" in c:
            rows.append(["compile", "tree", entry_id, c["error"]])
    if not rows:
        return ""
    return "Not measured:\n\n" + C.table(["size", "kind", "entry", "why"], rows)


def targets(results: dict) -> tuple[str, dict]:
    """Each target of the issue with the measured figure and whether it is met."""
    rows, summary = [], {}
    # 1. Step time <= Optax's for every entry, size, kind.
    for size, per in results["sizes"].items():
        for kind in KINDS:
            ratios = {}
            for entry_id, kinds in per["entries"].items():
                r = kinds.get(kind, {})
                o = r.get("ours", {}).get("median")
                ref = r.get("optax", {}).get("median")
                if o and ref:
                    ratios[entry_id] = C.ratio(o, ref)
            if not ratios:
                continue
            worst = sorted(ratios.items(), key=lambda kv: -kv[1])
            over = [f"{i} {v:.2f}" for i, v in worst if v > 1.0]
            rows.append(
                [
                    f"step eqxopt/optax <= 1.0 ({size} {kind})",
                    f"median {C.median(list(ratios.values())):.2f}, max "
                    f"{worst[0][1]:.2f} ({worst[0][0]})",
                    "met" if not over else f"{len(over)}/{len(ratios)} over",
                    ", ".join(over[:6]) + (" ..." if len(over) > 6 else ""),
                ]
            )
    # 2. Bandwidth-bound optimizers within 1.5x the floor at 10M-50M.
    for entry_id, bound in FLOOR_TARGETS.items():
        for size, per in results["sizes"].items():
            if SIZES.get(size, 0) < 10_000_000:
                continue
            for kind in KINDS:
                r = per["entries"].get(entry_id, {}).get(kind, {})
                o, fl = (
                    r.get("ours", {}).get("median"),
                    r.get("floor", {}).get("median"),
                )
                ref = r.get("optax", {}).get("median")
                if not (o and fl):
                    continue
                x = C.ratio(o, fl)
                rows.append(
                    [
                        f"{entry_id} <= {bound}x floor ({size} {kind})",
                        f"{x:.2f}x (optax {C.ratio(ref, fl):.2f}x)"
                        if ref
                        else f"{x:.2f}x",
                        "met" if x <= bound else "not met",
                        "",
                    ]
                )
    # 3. AdamW on the tree at 1M within 1.3x the flat floor.
    per = results["sizes"].get("1M")
    if per:
        for entry_id in ("adamw",):
            r = per["entries"].get(entry_id, {}).get("tree", {})
            o, fl = r.get("ours", {}).get("median"), r.get("floor", {}).get("median")
            ref = r.get("optax", {}).get("median")
            if o and fl:
                x = C.ratio(o, fl)
                rows.append(
                    [
                        f"{entry_id} tree 1M <= {TREE_TARGET}x flat floor",
                        f"{x:.2f}x (optax {C.ratio(ref, fl):.2f}x)"
                        if ref
                        else f"{x:.2f}x",
                        "met" if x <= TREE_TARGET else "not met",
                        "",
                    ]
                )
        fb = per.get("flat_buffer")
        if fb:
            fl = fb["flat floor"]
            x = C.ratio(fb["flattened"], fl)
            rows.append(
                [
                    f"(AdamW updated as one flat buffer) tree 1M <= {TREE_TARGET}x",
                    f"{x:.2f}x (per leaf {C.ratio(fb['per leaf'], fl):.2f}x, tree "
                    f"floor {C.ratio(fb['tree floor'], fl):.2f}x)",
                    "met" if x <= TREE_TARGET else "not met",
                    "experiment, not shipped",
                ]
            )
    # 4. Trace+compile <= 1.2x Optax's.
    comp = {
        i: C.ratio(c["ours"], c["optax"])
        for i, c in results.get("compile", {}).items()
        if "error" not in c and _has_optax(c)
    }
    if comp:
        worst = sorted(comp.items(), key=lambda kv: -kv[1])
        over = [f"{i} {v:.2f}" for i, v in worst if v > COMPILE_TARGET]
        rows.append(
            [
                f"trace+compile eqxopt/optax <= {COMPILE_TARGET}",
                f"median {C.median(list(comp.values())):.2f}, max {worst[0][1]:.2f} "
                f"({worst[0][0]})",
                "met" if not over else f"{len(over)}/{len(comp)} over",
                ", ".join(over[:6]) + (" ..." if len(over) > 6 else ""),
            ]
        )
    # 5. No param-sized copies in any compiled eqxopt step.
    with_copies = sorted(
        {
            f"{entry_id} ({kind})"
            for per in results["sizes"].values()
            for entry_id, kinds in per["entries"].items()
            for kind, r in kinds.items()
            if (r.get("ours") or {}).get("copies")
        }
    )
    rows.append(
        [
            "no param-sized copies (eqxopt)",
            f"{len(with_copies)} entries with copies",
            "met" if not with_copies else "not met",
            ", ".join(with_copies[:8]) + (" ..." if len(with_copies) > 8 else ""),
        ]
    )
    summary["rows"] = rows
    return C.table(["target", "measured", "status", "offenders"], rows), summary


def machine_text(info: dict, docs: bool = False) -> str:
    """The machine line; for docs (`docs=True`) without the date and load of the
    run, which stay in the results JSON."""
    text = (
        f"{info['cpu']}, {info['cores']} cores, {info['memory_gb']} GB, "
        f"{info['backend']} ({info['devices']}); jax {info['jax']}, jaxlib "
        f"{info['jaxlib']}, equinox {info['equinox']}, optax {info['optax']}, "
        f"eqxopt {info['eqxopt']}, Python {info['python']}"
    )
    if not docs:
        for key, label in (("date", ""), ("load_average", "load average at start ")):
            if info.get(key):
                text += f"; {label}{info[key]}"
    if info.get("note"):
        text += f"; {info['note']}"
    return text


def relative_command(command: str) -> str:
    """`command` with absolute paths made relative to the repository (or cut to
    their file name outside it): commands are printed in the docs."""
    root = C.repo_root().resolve()
    words = []
    for word in command.split(" "):
        key, eq, value = (
            word.rpartition("=") if word.startswith("--") else ("", "", word)
        )
        if value.startswith("/"):
            path = Path(value)
            try:
                value = str(path.resolve().relative_to(root))
            except ValueError:
                value = path.name
        words.append(key + eq + value)
    return " ".join(words)


def report(results: dict) -> str:
    parts = [
        "Machine: " + machine_text(results["machine"]),
        "",
        "Bandwidth floor (one fused elementwise step moving AdamW's bytes, donated):",
        "",
        floor_table(results),
        "",
        "Targets:",
        "",
        targets(results)[0],
        "",
        "Many small leaves as one flat buffer (AdamW on the 63-leaf tree, "
        "multiples of the flat floor):",
        "",
        flat_buffer_table(results),
        "",
        "Step time: median ms per step of eqxopt, ratio eqxopt/Optax, and each "
        "side's ratio to the flat floor measured in the same rounds:",
        "",
        step_tables(results),
        "Trace+compile of the step on the 1M tree (median seconds):",
        "",
        compile_table(results),
        "",
        memory_table(results),
        "",
        "Param-sized copies in the optimized HLO, unusable donations, and state "
        "leaves that `init` returned sharing a buffer with a param or another leaf:",
        "",
        copies_table(results),
        "",
        errors_table(results),
    ]
    return "\n".join(parts)


# --- plots ---------------------------------------------------------------------------


# Figures for a docs page about 750 px wide: 8 inches at 10-11 pt, saved at 150 dpi.
_FIG_WIDTH = 8.0
_DPI = 150
_KIND_STYLE = {
    "tree": {"marker": "o", "color": "tab:blue", "label": "63-leaf tree"},
    "flat": {"marker": "s", "color": "tab:orange", "label": "flat vector"},
}
_FLOOR_NAMES = {
    "sgd_momentum": "SGD with momentum",
    "adamw": "AdamW",
    "lion": "Lion",
    "adafactor": "Adafactor",
    "multisteps3_adam": "Adam accumulated over 3 calls",
}


def step_ratios(results: dict, size: str, kind: str) -> dict[str, float]:
    """eqxopt / Optax step time of every entry measured against Optax at (size,
    kind): the `/optax` column of the step tables."""
    out = {}
    for entry_id, kinds in results["sizes"][size]["entries"].items():
        r = kinds.get(kind, {})
        o = (r.get("ours") or {}).get("median")
        ref = (r.get("optax") or {}).get("median")
        if o and ref:
            out[entry_id] = C.ratio(o, ref)
    return out


def _log_ticks(ax, lo: float, hi: float, axis: str = "y") -> None:
    """Log axis from `lo` to `hi` with plain-number ticks (0.1, 0.2, 0.5, 1, 2...)."""
    import matplotlib.ticker as mticker

    candidates = [0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50]
    ticks = [t for t in candidates if lo <= t <= hi]
    if axis == "y":
        ax.set_yscale("log")
        ax.set_ylim(lo, hi)
        ax.yaxis.set_major_locator(mticker.FixedLocator(ticks))
        ax.yaxis.set_major_formatter(mticker.FixedFormatter([f"{t:g}" for t in ticks]))
        ax.yaxis.set_minor_locator(mticker.NullLocator())
    else:
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.xaxis.set_major_locator(mticker.FixedLocator(ticks))
        ax.xaxis.set_major_formatter(mticker.FixedFormatter([f"{t:g}" for t in ticks]))
        ax.xaxis.set_minor_locator(mticker.NullLocator())


def _label_stack(ax, points, corner: str) -> None:
    """Label `points` ((x, y, text) in data coordinates) with a stack of texts in an
    empty corner of the axes ("upper left" or "lower right"), one line each, joined
    to their points by thin leader lines: the labels never overlap each other."""
    step = 0.12
    for j, (x, y, text) in enumerate(points):
        if corner == "upper left":
            xy_text, ha, va = (0.02, 0.95 - j * step), "left", "top"
        else:
            xy_text, ha, va = (0.98, 0.05 + j * step), "right", "bottom"
        ax.annotate(
            text,
            xy=(x, y),
            xycoords="data",
            xytext=xy_text,
            textcoords="axes fraction",
            ha=ha,
            va=va,
            fontsize=9,
            arrowprops={"arrowstyle": "-", "lw": 0.6, "color": "0.45"},
        )


def _sorted_dots(ax, ratios: dict[str, float], style: dict, **kwargs):
    """`ratios` sorted ascending, at x = the entry's position in [0, 1] (so sizes
    with fewer entries span the same width). Returns [(x, ratio, entry_id)]."""
    items = sorted(ratios.items(), key=lambda kv: kv[1])
    n = len(items)
    xs = [(i + 0.5) / n for i in range(n)]
    ax.plot(
        xs,
        [v for _, v in items],
        ls="none",
        marker=style["marker"],
        color=style["color"],
        ms=4.5,
        alpha=0.85,
        **kwargs,
    )
    return [(x, v, i) for x, (i, v) in zip(xs, items)]


def _machine_caption(results: dict) -> str:
    m = results["machine"]
    return (
        f"{m['cpu']}, {m['cores']} cores, {m['backend']}; jax {m['jax']}, "
        f"optax {m['optax']}"
    )


def plot_step_ratio(results: dict, plt):
    """One panel per size: every entry's step-time ratio eqxopt / Optax, sorted,
    tree and flat; the three slowest and three fastest are labelled."""
    sizes = list(results["sizes"])
    all_ratios = {
        (size, kind): step_ratios(results, size, kind)
        for size in sizes
        for kind in KINDS
    }
    values = [v for r in all_ratios.values() for v in r.values()]
    if not values:  # a run without timing (`--no-timing`)
        return None
    lo = min(0.05, 0.8 * min(values))
    hi = max(8.0, 4 * max(values))
    fig, axes = plt.subplots(
        len(sizes),
        1,
        figsize=(_FIG_WIDTH, 2.55 * len(sizes) + 1.1),
        sharex=True,
        layout="constrained",
        squeeze=False,
    )
    for ax, size in zip(axes[:, 0], sizes):
        points, medians = [], []
        for kind in KINDS:
            ratios = all_ratios[(size, kind)]
            if not ratios:
                continue
            points += [
                (x, v, f"{i} ({kind}) {v:.2f}")
                for x, v, i in _sorted_dots(ax, ratios, _KIND_STYLE[kind])
            ]
            medians.append(
                f"{kind} {C.median(list(ratios.values())):.2f} ({len(ratios)} entries)"
            )
        ax.axhline(1.0, color="k", lw=0.9, zorder=0)
        _log_ticks(ax, lo, hi)
        ax.set_xlim(0, 1)
        ax.grid(axis="y", color="0.9", lw=0.6, zorder=-1)
        n = C.human(results["sizes"][size]["n_params"])
        ax.set_title(f"{n} parameters; median " + ", ".join(medians), loc="left")
        ax.set_ylabel("eqxopt / Optax")
        slow = sorted(points, key=lambda p: -p[1])[:3]
        fast = sorted(points, key=lambda p: p[1])[:3]
        _label_stack(ax, [p for p in slow if p[1] > 1.0], "upper left")
        _label_stack(ax, [p for p in fast if p[1] < 1.0], "lower right")
    axes[-1, 0].set_xlabel("registry entries, sorted by their ratio (0: fastest)")
    handles = [
        plt.Line2D(
            [], [], ls="none", marker=s["marker"], color=s["color"], label=s["label"]
        )
        for s in _KIND_STYLE.values()
    ] + [plt.Line2D([], [], color="k", lw=0.9, label="as fast as Optax")]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, frameon=False)
    fig.suptitle(
        "Step time, eqxopt / Optax (below 1: eqxopt is faster)\n"
        + _machine_caption(results),
        x=0.01,
        ha="left",
        fontsize=10.5,
    )
    return fig


def plot_floor(results: dict, plt):
    """Five optimizers' step time as a multiple of the flat floor, by size."""
    import matplotlib.ticker as mticker

    sizes = list(results["sizes"])
    entry_ids = list(results["sizes"][sizes[0]]["entries"])
    focus = [i for i in _FLOOR_NAMES if i in entry_ids]
    fig, axes = plt.subplots(
        1, 2, figsize=(_FIG_WIDTH, 4.6), sharey=True, layout="constrained"
    )
    values = []
    ns = [results["sizes"][s]["n_params"] for s in sizes]
    for ax, kind in zip(axes, KINDS):
        for j, entry_id in enumerate(focus):
            for side, ls, marker in (("ours", "-", "o"), ("optax", ":", "x")):
                xs, ys = [], []
                for size in sizes:
                    r = results["sizes"][size]["entries"].get(entry_id, {}).get(kind)
                    o = ((r or {}).get(side) or {}).get("median")
                    if not o or "floor" not in r:
                        continue
                    xs.append(results["sizes"][size]["n_params"])
                    ys.append(C.ratio(o, r["floor"]["median"]))
                values += ys
                ax.plot(xs, ys, ls=ls, marker=marker, ms=5, lw=1.6, color=f"C{j}")
        ax.axhline(1.0, color="k", lw=0.9)
        ax.set_title("63-leaf tree" if kind == "tree" else "flat vector")
        ax.set_xscale("log")
        ax.set_xlim(min(ns) / 1.6, max(ns) * 1.6)
        ax.xaxis.set_major_locator(mticker.FixedLocator(ns))
        ax.xaxis.set_major_formatter(mticker.FixedFormatter(sizes))
        ax.xaxis.set_minor_locator(mticker.NullLocator())
        ax.set_xlabel("parameters")
        ax.grid(axis="y", color="0.9", lw=0.6)
    if not values:  # a run without timing, or without these entries
        plt.close(fig)
        return None
    _log_ticks(axes[0], min(0.2, 0.8 * min(values)), max(10, 1.25 * max(values)))
    axes[0].set_ylabel("step time / flat floor")
    handles = [
        plt.Line2D([], [], color=f"C{j}", lw=2.5, label=_FLOOR_NAMES[i])
        for j, i in enumerate(focus)
    ] + [
        plt.Line2D([], [], color="k", lw=0.9, label="the floor"),
        plt.Line2D([], [], color="0.3", ls="-", marker="o", label="eqxopt"),
        plt.Line2D([], [], color="0.3", ls=":", marker="x", label="Optax"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=4, frameon=False)
    fig.suptitle(
        "Step time as a multiple of the bandwidth floor\n" + _machine_caption(results),
        x=0.01,
        ha="left",
        fontsize=10.5,
    )
    return fig


def plot_compile(results: dict, plt):
    """Every entry's trace+compile time ratio eqxopt / Optax, sorted."""
    comp = results.get("compile", {})
    ratios = {
        i: C.ratio(c["ours"], c["optax"])
        for i, c in comp.items()
        if "error" not in c and _has_optax(c)
    }
    if not ratios:
        return None
    fig, ax = plt.subplots(figsize=(_FIG_WIDTH, 3.8), layout="constrained")
    style = {"marker": "o", "color": "tab:blue"}
    points = _sorted_dots(ax, ratios, style)
    ax.axhline(1.0, color="k", lw=0.9)
    ax.axhline(COMPILE_TARGET, color="tab:red", lw=1.0, ls="--")
    ax.text(
        0.5,
        COMPILE_TARGET * 1.03,
        f"{COMPILE_TARGET:g}",
        color="tab:red",
        fontsize=9,
        va="bottom",
    )
    _log_ticks(ax, min(0.2, 0.8 * min(ratios.values())), 8.0)
    ax.set_xlim(0, 1)
    ax.grid(axis="y", color="0.9", lw=0.6, zorder=-1)
    slow = sorted(points, key=lambda p: -p[1])[:4]
    _label_stack(ax, [(x, v, f"{i} {v:.2f}") for x, v, i in slow], "upper left")
    fast = sorted(points, key=lambda p: p[1])[:2]
    _label_stack(ax, [(x, v, f"{i} {v:.2f}") for x, v, i in fast], "lower right")
    ax.set_xlabel("registry entries, sorted by their ratio (0: fastest)")
    ax.set_ylabel("eqxopt / Optax")
    n = C.human(list(results["sizes"].values())[0]["n_params"])
    ax.set_title(
        f"Trace+compile time of the step on the {n} tree, eqxopt (state checks "
        f"on) / Optax\nmedian {C.median(list(ratios.values())):.2f} over "
        f"{len(ratios)} entries; {_machine_caption(results)}",
        loc="left",
    )
    return fig


def plot(results: dict, outdir: Path) -> list[Path]:
    """Write the PNGs of the benchmarks pages: `bench_step_ratio.png`,
    `bench_floor.png` and `bench_compile.png`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    makers = (
        ("bench_step_ratio.png", plot_step_ratio),
        ("bench_floor.png", plot_floor),
        ("bench_compile.png", plot_compile),
    )
    with plt.rc_context(
        {
            "font.size": 10,
            "axes.titlesize": 10.5,
            "axes.labelsize": 10,
            "xtick.labelsize": 9.5,
            "ytick.labelsize": 9.5,
            "legend.fontsize": 9.5,
        }
    ):
        for name, make in makers:
            fig = make(results, plt)
            if fig is None:
                continue
            path = outdir / name
            fig.savefig(path, dpi=_DPI)
            plt.close(fig)
            written.append(path)
    return written


# --- main ----------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1M, a few entries")
    parser.add_argument("--sizes", help="comma-separated, from " + ",".join(SIZES))
    parser.add_argument("--only", help="regex on registry ids")
    parser.add_argument(
        "--repeats",
        type=int,
        help="timed rounds per entry (default 7 at 1M, 5 at 10M, 3 at 50M)",
    )
    parser.add_argument(
        "--compile-rounds",
        type=int,
        help="trace+compile rounds besides the timing run's compile (default 1)",
    )
    parser.add_argument(
        "--max-step-seconds",
        type=float,
        default=1.5,
        help="do not time an entry whose single step takes longer (default 1.5)",
    )
    parser.add_argument(
        "--no-timing",
        action="store_true",
        help="compile and inspect only (memory, copies, donations)",
    )
    parser.add_argument("--json", help="write raw results to this file")
    parser.add_argument(
        "--merge",
        help="saved results whose entries this run's replace (a re-run of some "
        "entries with more repeats); write the merge with --json",
    )
    parser.add_argument("--from-json", help="report (and plot) saved results")
    parser.add_argument("--plot", action="store_true", help="write docs/_static PNGs")
    parser.add_argument("--plot-dir", default=str(C.repo_root() / "docs" / "_static"))
    parser.add_argument("--docs", help="update the update.py section of this page")
    args = parser.parse_args(argv)

    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
    else:
        results = run(args)
        if args.merge:
            results = merge(json.loads(Path(args.merge).read_text()), results)
    text = report(results)
    print(text)
    if args.json and not args.from_json:
        Path(args.json).write_text(json.dumps(results, indent=1))
        print(f"\nwrote {args.json}")
    if args.plot:
        for path in plot(results, Path(args.plot_dir)):
            print(f"wrote {path}")
    if args.docs:
        C.write_docs_section(args.docs, "update.py", docs_text(results))
        print(f"updated {args.docs}")


def merge(base: dict, new: dict) -> dict:
    """`base` with every entry (size, kind) and compile record measured in `new`
    replaced, and the re-run recorded under `reruns`."""
    for size, per in new["sizes"].items():
        target = base["sizes"].setdefault(size, per)
        if target is per:
            continue
        for entry_id, kinds in per["entries"].items():
            target["entries"].setdefault(entry_id, {}).update(kinds)
    for entry_id, c in new.get("compile", {}).items():
        if "error" in c or c["samples"]["ours"]:
            base.setdefault("compile", {})[entry_id] = c
    base.setdefault("reruns", []).append(
        {
            "command": new["command"],
            "date": new["machine"]["date"],
            "entries": sorted(
                {i for per in new["sizes"].values() for i in per["entries"]}
            ),
        }
    )
    return base


def docs_text(results: dict) -> str:
    return "\n".join(
        [
            "Machine: " + machine_text(results["machine"], docs=True) + ".",
            "",
            "Command: `" + relative_command(results["command"]) + "`",
            "",
            *[
                f"Re-run: `{relative_command(r['command'])}` ({len(r['entries'])} "
                "entries; their figures replace the sweep's).\n"
                for r in results.get("reruns", [])
            ],
            # The targets and the flat-buffer experiment are for developers: the
            # console report and benchmarks/README.md have them, the site does not.
            "### Bandwidth floor",
            "",
            floor_table(results),
            "",
            "### Step time",
            "",
            "Median milliseconds per step of eqxopt; `/optax` is the ratio of "
            "medians eqxopt/Optax (below 1: eqxopt is faster); `/floor` is each "
            "side's ratio to the flat floor measured in the same rounds.",
            "",
            step_tables(results),
            "### Trace+compile",
            "",
            "Median seconds to trace, lower and compile the step on the 1M tree "
            "(fresh function each time), eqxopt with its state checks on; the trace "
            "alone with the checks on and off.",
            "",
            compile_table(results),
            "",
            "### Memory",
            "",
            memory_table(results),
            "",
            "### Copies and donation",
            "",
            copies_table(results),
            "",
            errors_table(results),
        ]
    )


def run(args) -> dict:
    if args.quick:
        sizes = ["1M"]
        default_ids = [i for i in QUICK_IDS if any(c.id == i for c in CASES)]
        repeats, compile_rounds, min_seconds = 3, 0, 0.005
    else:
        sizes = list(SIZES)
        default_ids = [c.id for c in CASES]
        repeats, compile_rounds, min_seconds = None, 1, 0.02
    if args.sizes:
        sizes = args.sizes.split(",")
    # Rounds per entry: fewer where one step is long (the medians of 3 rounds of
    # 50M-parameter steps are as stable as those of 7 rounds at 1M).
    default_repeats = {"1M": 7, "10M": 5, "50M": 3}
    repeats_of = lambda size: args.repeats or repeats or default_repeats.get(size, 5)
    compile_rounds = (
        args.compile_rounds if args.compile_rounds is not None else compile_rounds
    )
    cases = [c for c in CASES if c.id in default_ids]
    if args.only:
        cases = [c for c in CASES if re.search(args.only, c.id)]
    results = {
        "machine": C.machine_info(),
        "command": "python benchmarks/update.py " + " ".join(sys.argv[1:]),
        "sizes": {},
        "compile": {},
    }
    start = time.perf_counter()
    print(C.machine_line(results["machine"]), flush=True)
    too_slow: set[tuple[str, str]] = set()
    for size in sizes:
        repeats = repeats_of(size)
        shapes = C.transformer_shapes(SIZES[size])
        n = C.count(shapes)
        per = {"n_params": n, "leaves": len(shapes), "entries": {}}
        results["sizes"][size] = per
        floors = {}
        for kind in KINDS:
            base = base_arrays(shapes, kind, 0)
            grads_base = base_arrays(shapes, kind, 1)
            floors[kind] = floor_runner(base if kind == "tree" else base["flat"])[0]
        ftimes = C.interleaved(floors, max(repeats * 2, 6), min_seconds)
        per["floors"] = {kind: C.median(ts) for kind, ts in ftimes.items()}
        print(
            f"\n{size}: {C.human(n)} params, {len(shapes)} leaves; flat floor "
            f"{1e3 * per['floors']['flat']:.3f} ms, tree floor "
            f"{1e3 * per['floors']['tree']:.3f} ms",
            flush=True,
        )
        if not (args.no_timing or args.quick):
            base = base_arrays(shapes, "tree", 0)
            grads_base = base_arrays(shapes, "tree", 1)
            fb = flat_buffer_experiment(
                shapes, base, grads_base, floors, repeats, min_seconds
            )
            per["flat_buffer"] = fb
            print(
                "  flat-buffer experiment (AdamW, tree): per leaf "
                f"{C.ratio(fb['per leaf'], fb['flat floor']):.2f}x, as one buffer "
                f"{C.ratio(fb['flattened'], fb['flat floor']):.2f}x the flat floor",
                flush=True,
            )
        for kind in KINDS:
            base = base_arrays(shapes, kind, 0)
            grads_base = base_arrays(shapes, kind, 1)
            for case in cases:
                entry = per["entries"].setdefault(case.id, {})
                if (case.id, kind) in too_slow:
                    entry[kind] = {"skipped": "too slow at a smaller size"}
                    continue
                try:
                    r = measure(
                        case,
                        kind,
                        shapes,
                        base,
                        grads_base,
                        floors["flat"],
                        repeats,
                        min_seconds,
                        args.max_step_seconds,
                        not args.no_timing,
                    )
                except Exception as e:  # noqa: BLE001 - report, go on
                    r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
                    if os.environ.get("EQXOPT_BENCH_DEBUG"):
                        traceback.print_exc()
                entry[kind] = r
                if "skipped" in r:
                    too_slow.add((case.id, kind))
                print(_line(size, kind, case.id, r), flush=True)
                gc.collect()
            del base, grads_base
        del floors
        gc.collect()
        if args.json and not args.merge:  # partial results, if interrupted
            Path(args.json).write_text(json.dumps(results, indent=1))
    # Trace+compile on the smallest size's tree.
    size = sizes[0]
    shapes = C.transformer_shapes(SIZES[size])
    print(f"\ntrace+compile ({size} tree, {compile_rounds} more rounds)", flush=True)
    for case in cases:
        first = results["sizes"][size]["entries"].get(case.id, {}).get("tree")
        try:
            c = compile_times(case, shapes, compile_rounds, first)
        except Exception as e:  # noqa: BLE001
            c = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        results["compile"][case.id] = c
        if "error" not in c:
            print(
                f"  {case.id:34s} eqxopt {c['ours']:.3f} s  optax "
                f"{c['optax']:.3f} s  ratio {C.ratio(c['ours'], c['optax']):.2f}"
                f"  (trace {c['ours_lower']:.3f} s, checks off "
                f"{C.fmt(c['ours_lower_nocheck'], 3)} s)",
                flush=True,
            )
        else:
            print(f"  {case.id:34s} {c['error']}", flush=True)
    results["seconds"] = time.perf_counter() - start
    print(f"\ntotal {results['seconds']:.0f} s\n", flush=True)
    return results


def _line(size, kind, entry_id, r) -> str:
    if "error" in r or "skipped" in r:
        return f"  {size} {kind} {entry_id:34s} {r.get('error') or r['skipped']}"
    copies = len(r["ours"]["copies"])
    if "median" not in r["ours"]:
        ref_copies = len((r.get("optax") or {}).get("copies", []))
        mem = (r["ours"]["memory"] or {}).get("peak", 0) / 2**20
        return (
            f"  {size} {kind} {entry_id:34s} copies {copies} (optax {ref_copies}),"
            f" peak {mem:.1f} MB, unusable donations "
            f"{r['ours']['unusable_donations']}"
        )
    o = r["ours"]["median"]
    ref = (r.get("optax") or {}).get("median")
    fl = r["floor"]["median"]
    text = f"  {size} {kind} {entry_id:34s} {1e3 * o:8.3f} ms"
    if ref:
        text += f"  optax {1e3 * ref:8.3f} ms  ratio {C.ratio(o, ref):5.2f}"
        text += f"  floor x{C.ratio(o, fl):5.2f} (optax x{C.ratio(ref, fl):5.2f})"
    else:
        text += f"  floor x{C.ratio(o, fl):5.2f}"
    if copies:
        text += f"  copies {copies}"
    return text


if __name__ == "__main__":
    main()
