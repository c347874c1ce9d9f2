"""Where the optimizer step's compile time goes, per optimizer, as ratios to AdamW.

On the transformer-like tree of `_common.transformer_shapes` (63 float32 leaves, about
10M params by default), for SOAP, Shampoo, Kron, NorMuon, Muon and AdamW (each with
its defaults, as `benchmarks/matrix.py` builds them), this script jits the optimizer
step alone (`opt.update`, then the updates added to the params; params and state
donated) on abstract arguments and times its three stages, in one process:

- trace: `jax.jit(step).trace(params, state, grads)` (Python: the optimizer's code
  run on tracers, giving a jaxpr);
- lower: `.lower()` (the jaxpr to StableHLO);
- compile: `.compile()` (XLA's passes and code generation).

and counts the program's size: the jaxpr's equations (all sub-jaxprs included), the
StableHLO's operations, and the instructions of the optimized HLO module (all its
computations), with its `while`, `conditional` and `custom-call` instructions, and
its distinct kernels (fusions that differ other than by name: XLA:CPU generates
machine code once for each).
Every optimizer is measured `--repeats` times (a fresh step function each time, so
nothing is cached; the order alternates every round) and the medians are printed,
with each total (trace + lower + compile) over AdamW's.

    python benchmarks/compile_time.py                  # 10M params, 3 repeats
    python benchmarks/compile_time.py --size 1M --repeats 1 --only SOAP,AdamW
    python benchmarks/compile_time.py --quick            # 20K params, AdamW and Muon

`--kernels N` then compiles each step once more, in a child process with XLA's
compiler logging on (`TF_CPP_VMODULE=cpu_compiler=1,ir_compiler=1,
fusion_compiler=1`), and prints where XLA's time went: its HLO passes, and the code
generation of each kernel (the MLIR emitters, then LLVM; both summed over the
compile threads), with the share of the copy and transpose kernels and the `N`
costliest kernels.
"""

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (puts the repository root on sys.path)
import jax
import jax.extend
import jax.tree_util as jtu

import eqxopt


def optimizers() -> dict:
    return {
        "AdamW": eqxopt.AdamW(1e-3),
        "Muon": eqxopt.Muon(0.02),
        "NorMuon": eqxopt.NorMuon(0.02),
        "SOAP": eqxopt.SOAP(3e-3, precondition_frequency=10),
        "Shampoo": eqxopt.Shampoo(1e-3, preconditioning_compute_steps=10),
        "Kron": eqxopt.Kron(1e-3),
    }


def make_step(opt):
    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return jtu.tree_map(lambda p, u: p + u, params, updates), state

    return step


def jaxpr_size(jaxpr) -> int:
    """Equations of `jaxpr` and of every jaxpr in its equations' parameters."""
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            n += jaxpr_size(sub)
    return n


# `  %name = f32[8,8]{1,0} dot(...)`, `  ROOT %t = (f32[8]{0}, s32[]) tuple(...)`: the
# opcode is the first lowercase word right before a parenthesis after the `=`.
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?[\w.\-]+ = .*?\s([a-z][\w\-]*)\(", re.M)


def hlo_counts(text: str) -> dict[str, int]:
    """Instructions of an HLO module's text (every computation), and some kinds."""
    ops = _INSTRUCTION.findall(text)
    return {
        "hlo": len(ops),
        "while": ops.count("while"),
        "cond": ops.count("conditional"),
        "custom": ops.count("custom-call"),
        "dot": ops.count("dot"),
    }


_COMPUTATION = re.compile(r"\n(?=\S)")
_FUSION_CALL = re.compile(r" fusion\(.*?calls=%?([\w.\-]+)")
_NAME = re.compile(r"%[\w.\-]+")
_METADATA = re.compile(r", metadata=\{[^}]*\}")


def distinct_kernels(text: str) -> int:
    """The distinct fusions of an HLO module's text: fused computations that differ
    once their instruction names and metadata are set aside. XLA:CPU generates code
    once for each, however many instructions call it."""
    bodies = {}
    for computation in _COMPUTATION.split(text):
        head, _, body = computation.partition("\n")
        bodies[head.split(" ", 1)[0].lstrip("%")] = body
    called = {
        m.group(1)
        for name, body in bodies.items()
        if not name.startswith(("fused_", "wrapped_"))
        for m in _FUSION_CALL.finditer(body)
    }
    return len(
        {_NAME.sub("%", _METADATA.sub("", bodies[c])) for c in called if c in bodies}
    )


def measure(opt, args) -> dict:
    jitted = jax.jit(make_step(opt), donate_argnums=(0, 1))
    t0 = time.perf_counter()
    traced = jitted.trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    stablehlo = lowered.as_text()
    out = {
        "trace": t1 - t0,
        "lower": t2 - t1,
        "compile": t3 - t2,
        "jaxpr": jaxpr_size(traced.jaxpr.jaxpr),
        "stablehlo": sum(1 for line in stablehlo.splitlines() if " = " in line),
    }
    text = compiled.as_text()
    out.update(hlo_counts(text))
    out["kernels"] = distinct_kernels(text)
    return out


_XLA_LOG = {
    "TF_CPP_MIN_LOG_LEVEL": "0",
    "TF_CPP_VMODULE": "cpu_compiler=1,ir_compiler=1,fusion_compiler=1",
}
_LOGGED = re.compile(
    r"(Running HLO passes|Compiled LLVM module|Compiled MLIR module):? (?:on )?(\S+)"
    r"(?: for CPU)? time: ([\d.]+) (us|ms|s) "
)
_MEASURED = "compile_time.py: the measured compile starts"
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def xla_times(log: str) -> dict:
    """XLA's compiler log (`_XLA_LOG`) summed: HLO passes, MLIR and LLVM code
    generation (seconds over all threads), and LLVM seconds per kernel."""
    out: dict = {"passes": 0.0, "mlir": 0.0, "llvm": 0.0, "kernels": {}}
    log = log.split(_MEASURED)[-1]
    for stage, name, value, unit in _LOGGED.findall(log):
        seconds = float(value) * _UNIT[unit]
        if stage == "Running HLO passes":
            out["passes"] += seconds
        elif stage == "Compiled MLIR module":
            out["mlir"] += seconds
        else:
            out["llvm"] += seconds
            kernel = re.sub(r"^(__compute_module_)+|_kernel_module$", "", name)
            out["kernels"][kernel] = seconds
    return out


def kernel_report(name: str, args, top: int) -> None:
    """Compile `name`'s step in a child process with XLA's logging on and print
    where XLA's time went."""
    cmd = [sys.executable, __file__, "--xla-log-of", name, "--size", args.size]
    cmd += ["--layers", str(args.layers)]
    run = subprocess.run(
        cmd, env={**os.environ, **_XLA_LOG}, capture_output=True, text=True
    )
    t = xla_times(run.stderr)
    if not t["kernels"]:
        print(f"{name}: XLA logged no kernel times (has its log format changed?)")
        return
    copies = sum(v for k, v in t["kernels"].items() if "copy" in k or "transpose" in k)
    print(
        f"{name}: HLO passes {t['passes']:.2f} s; code generation of "
        f"{len(t['kernels'])} kernels: MLIR {t['mlir']:.2f} s, LLVM {t['llvm']:.2f} s "
        f"(copy and transpose kernels {copies:.2f} s)"
    )
    worst = sorted(t["kernels"].items(), key=lambda kv: -kv[1])[:top]
    print("    " + ", ".join(f"{k} {1e3 * v:.0f} ms" for k, v in worst))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="10M")
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated names")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 20K params, AdamW and Muon"
    )
    parser.add_argument("--kernels", type=int, default=0, help="XLA's time per kernel")
    parser.add_argument("--xla-log-of", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.size, args.repeats, args.only = "20K", 1, "Muon"
    size = args.size.upper()
    scale = {"K": 10**3, "M": 10**6}.get(size[-1], 1)
    n_params = int(float(size.rstrip("KM")) * scale)
    shapes = C.transformer_shapes(n_params, args.layers)
    params = {k: jax.ShapeDtypeStruct(s, jax.numpy.float32) for k, s in shapes.items()}
    opts = optimizers()
    if args.xla_log_of:  # the child of `kernel_report`: one compile, logged
        warm = opts["AdamW"]  # LLVM's first kernels in a process compile slower
        measure(warm, (params, jax.eval_shape(warm.init, params), params))
        print(_MEASURED, file=sys.stderr, flush=True)
        opt = opts[args.xla_log_of]
        measure(opt, (params, jax.eval_shape(opt.init, params), params))
        return
    if args.only:
        names = args.only.split(",")
        opts = {k: v for k, v in opts.items() if k in names or k == "AdamW"}
    print(C.machine_line(C.machine_info()))
    print(
        f"optimizer step alone, {C.human(C.count(shapes))} params in {len(shapes)} "
        f"leaves, {jax.default_backend()}; medians of {args.repeats} repeats\n",
        flush=True,
    )
    results: dict[str, list[dict]] = {k: [] for k in opts}
    for r in range(args.repeats):
        order = list(opts) if r % 2 == 0 else list(reversed(opts))
        for name in order:
            opt = opts[name]
            state = jax.eval_shape(opt.init, params)
            m = measure(opt, (params, state, params))
            results[name].append(m)
            print(
                f"  {name}: trace {m['trace']:.2f} s, lower {m['lower']:.2f} s, "
                f"compile {m['compile']:.2f} s",
                flush=True,
            )
    med = {
        name: {k: C.median([m[k] for m in ms]) for k in ms[0]}
        for name, ms in results.items()
    }
    for m in med.values():
        m["total"] = m["trace"] + m["lower"] + m["compile"]
    base = med["AdamW"]
    headers = [
        "optimizer",
        "trace s",
        "lower s",
        "compile s",
        "total s",
        "total / AdamW",
        "compile / AdamW",
        "jaxpr eqns",
        "StableHLO ops",
        "HLO instrs",
        "distinct kernels",
        "while",
        "cond",
        "custom-call",
        "dot",
    ]
    rows = [
        [
            name,
            C.fmt(m["trace"]),
            C.fmt(m["lower"]),
            C.fmt(m["compile"]),
            C.fmt(m["total"]),
            C.fmt(C.ratio(m["total"], base["total"]), 1),
            C.fmt(C.ratio(m["compile"], base["compile"]), 1),
            *(int(m[k]) for k in ("jaxpr", "stablehlo", "hlo", "kernels")),
            *(int(m[k]) for k in ("while", "cond", "custom", "dot")),
        ]
        for name, m in med.items()
    ]
    print()
    print(C.table(headers, rows))
    if args.kernels:
        print("\nWhere XLA's compile time went (one more compile each, logged):\n")
        for name in opts:
            kernel_report(name, args, args.kernels)


if __name__ == "__main__":
    main()
