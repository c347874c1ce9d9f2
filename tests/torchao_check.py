"""Check the NumPy transcription of torchao (`tests/torchao_transcription.py`) against
torchao itself, on CPU. Not a pytest module (no torch in the project's venv).

Run it in a venv with torch, torchao, numpy and ml_dtypes (the transcription's one
other import), never in the project's venv:

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.13.0 torchao numpy ml_dtypes
    /tmp/torchvenv/bin/python tests/torchao_check.py [--compile] [--save out.npz]

It runs torchao's `AdamW8bit`, `AdamW4bit` and `AdamWFp8` and the transcription
(torchao's leaf rule: a leaf under 4096 values or not a multiple of the block stays
plain) side by side on the same float32 or bfloat16 params and grads, for several
steps, and after every step compares the codes and scales of each quantized buffer
(read from torchao's `OptimState*` subclasses; int4 codes unpacked, fp8 codes as
their bit patterns), the plain buffers, and the params. Codes must be equal (a
mismatch is reported, and classed as a tie when the scaled value is within 1e-6,
relative, of the midpoint of the two codes' values), scales and params equal to
relative 1e-6. By default torchao's `torch.compile` of `single_param_adam` is
switched off (torchao has no option for it: `torch.compile` is patched to the
identity during `step`, so it runs eagerly); `--compile` leaves it on, as torchao
ships it (inductor's C++ code on CPU, so it needs a compiler and takes minutes).

`--save out.npz` also writes the inputs and torchao's outputs, and

    PYTHONPATH=. /work/main/.venv/bin/python tests/torchao_check.py --eqxopt out.npz

(the project's venv, without torch) runs `eqxopt.AdamW(..., state_dtype=
eqxopt.Quantized(fmt))` on the same inputs and compares it with torchao's outputs.

The transcription models torch's own float32 arithmetic on CPU, which this check
found: `linspace` (the int8 maps) and `lerp` are each one fused multiply-add in
eager mode, and `lr * weight_decay` is a float32 product; eager `sqrt` is MKL's (not
correctly rounded), so each run also feeds the transcription torch's `sqrt` ("torch.
sqrt" rows); the code `torch.compile` makes is unfused and correctly rounded, so
`--compile` runs the transcription with `fused=False` and NumPy's `sqrt` counts.

Result, 2026-11-29, torch 2.13.0+cpu, torchao 0.18.0, AMD EPYC (ATen AVX2), leaves
(64, 128), (5003,), (100,) and (4096,) with its first 512 grads 0, 5 steps, 122880
codes per format and dtype: eager and `--compile` alike, every code equal (0
mismatches, so 0 ties), every scale and plain buffer equal (rel 0), every param
equal (rel 0) in int8, int4 and fp8, float32 and bfloat16. The other `sqrt` leaves
codes, scales and bfloat16 params equal but float32 params off by up to rel 8.0e-6
(eager, NumPy's sqrt) or 1.6e-5 (compiled, torch's), at params near 0. Before the
fixes above, the int8 maps differed in 42 (signed) and 31 (unsigned) values by one
float32 ulp, and eager float32 moments by up to rel 1.8e-4 (scales 2.1e-7). eqxopt
itself on the same inputs (`--eqxopt`, leaves other than (5003,)): float32 codes all
equal, scales within rel 1.3e-5 (Optax's moving average), params within 1.2e-6 (one
float32 ulp per step at params near 2: the two round the step differently); bfloat16
codes 68, 12, 37-38 of 122880 differ (int8, int4, fp8; not classed), 186-261 of 61940
params one bfloat16 ulp apart (eqxopt rounds the update to bfloat16 before adding
it, torchao rounds the sum once).
"""

import argparse
import os
import sys
from unittest import mock

import ml_dtypes
import numpy as np


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchao_transcription as tt  # noqa: E402


SHAPES = {
    "w": (64, 128),  # quantized, whole blocks
    "odd": (5003,),  # >= 4096 values but not a multiple of the block: plain
    "small": (100,),  # under 4096 values: plain
    "zeros": (4096,),  # its first blocks see only zero grads
}
FORMATS = {"int8": ("AdamW8bit", 256), "int4": ("AdamW4bit", 128)}
FORMATS["fp8"] = ("AdamWFp8", 256)
DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
LR, B1, B2, WD, EPS = 1e-3, 0.9, 0.999, 1e-2, 1e-8
STEPS = 5
RTOL = 1e-6


def make_inputs(dtype):
    """Params and `STEPS` sets of grads, in `dtype` (torch wants a grad in its
    param's dtype)."""
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    grads = []
    for _ in range(STEPS):
        g = {}
        for i, (k, s) in enumerate(SHAPES.items()):
            x = rng.standard_normal(s).astype(np.float32) * np.float32(10.0 ** (i - 2))
            if k == "zeros":
                x[:512] = 0
            g[k] = x.astype(dtype)
        grads.append(g)
    return {k: v.astype(dtype) for k, v in params.items()}, grads


class Buffer(tt.NpBuffer):
    """The transcription's buffer, remembering the last float32 value written (to
    class fp8 mismatches as ties)."""

    def copy_(self, x):
        self.last = np.asarray(x, np.float32).reshape(-1)
        super().copy_(x)


def run_transcription(fmt, dtype, params, grads, sqrt=np.sqrt, fused=True):
    """Per step: {leaf: (param, [(codes, scale) or plain for exp_avg, exp_avg_sq],
    buffers)}."""
    block = FORMATS[fmt][1]
    ref_p = dict(params)
    bufs = {
        k: (
            Buffer(s, dtype, fmt, True, block, pad=False),
            Buffer(s, dtype, fmt, False, block, pad=False),
        )
        for k, s in SHAPES.items()
    }
    out = []
    for t, g in enumerate(grads, 1):
        step = {}
        for k in SHAPES:
            m, v = bufs[k]
            new = tt.np_adamw_step(
                ref_p[k], g[k], t, m, v, LR, B1, B2, WD, EPS, sqrt, fused
            )
            ref_p[k] = new.astype(dtype).reshape(SHAPES[k])
            state = []
            for b in (m, v):
                if b.quantized:
                    scaled = b.scaled.copy() if b.scaled is not None else None
                    last = b.last.copy()
                    state.append((b.codes.copy(), b.scale.copy(), scaled, last))
                else:
                    state.append(b.plain.astype(np.float32).reshape(-1).copy())
            step[k] = (ref_p[k].astype(np.float32).reshape(-1), state)
        out.append(step)
    return out


def run_torchao(fmt, dtype, params, grads, compile):
    """Per step: {leaf: (param, [(codes, scale) or plain])} from torchao."""
    import torch  # pyright: ignore[reportMissingImports]
    import torchao.optim  # pyright: ignore[reportMissingImports]

    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype.name]
    cls, block = FORMATS[fmt]
    tp = {
        k: torch.nn.Parameter(torch.from_numpy(v.astype(np.float32)).to(tdtype))
        for k, v in params.items()
    }
    opt = getattr(torchao.optim, cls)(
        list(tp.values()), lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD
    )
    assert opt.block_size == block
    out = []
    for g in grads:
        for k, p in tp.items():
            p.grad = torch.from_numpy(g[k].astype(np.float32)).to(tdtype)
        if compile:
            opt.step()
        else:  # torchao has no switch: `torch.compile` is the identity meanwhile
            with mock.patch.object(torch, "compile", lambda fn, **_: fn):
                opt.step()
        step = {}
        for k, p in tp.items():
            state = []
            for name in ("exp_avg", "exp_avg_sq"):
                b = opt.state[p][name]
                if hasattr(b, "codes"):
                    codes = b.codes
                    if fmt == "fp8":
                        codes = codes.view(torch.uint8)
                    codes = codes.reshape(-1).numpy().copy()
                    if fmt == "int4":
                        codes = np.stack([codes >> 4, codes & 15], -1).reshape(-1)
                    state.append((codes, b.scale.numpy().copy()))
                else:
                    state.append(b.float().reshape(-1).numpy().copy())
            step[k] = (p.detach().float().reshape(-1).numpy().copy(), state)
        out.append(step)
    return out


def rel(a, b):
    """Largest |a - b| / |b| (0 where both are 0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = np.abs(a - b)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(d == 0, 0.0, d / np.abs(b))
    return float(r.max()) if r.size else 0.0


def ties(fmt, signed, ours, ref_codes, scaled, last, scale, block):
    """How many of the code mismatches are ties."""
    n = 0
    for i in np.nonzero(ours != ref_codes)[0]:
        if fmt == "fp8":
            f8 = np.array([ours[i], ref_codes[i]], np.uint8).view(
                ml_dtypes.float8_e4m3fn
            )
            a, b = f8.astype(np.float32)
            x = last[i] / scale[i // block] if i < last.size else np.float32(0)
        else:
            q = tt.QMAPS[fmt, signed]
            a, b, x = q[ours[i]], q[ref_codes[i]], scaled[i]
        mid = (np.float64(a) + np.float64(b)) / 2
        n += abs(float(x) - mid) <= RTOL * abs(mid)
    return n


def compare(fmt, dtype, ao, ref):
    """Figures for one format and dtype; `ok` unless a tolerance is broken."""
    block = FORMATS[fmt][1]
    fig = dict(codes=0, codes_total=0, tie=0, scale=0.0, plain=0.0, param=0.0)
    fig["param_neq"] = 0
    for t, (a_step, r_step) in enumerate(zip(ao, ref), 1):
        for k in SHAPES:
            (ap, astate), (rp, rstate) = a_step[k], r_step[k]
            fig["param"] = max(fig["param"], rel(ap, rp))
            fig["param_neq"] += int(np.sum(ap != rp))
            ulps = np.abs(ap.view(np.int32).astype(np.int64) - rp.view(np.int32))
            fig["param_ulp"] = max(fig.get("param_ulp", 0), int(ulps.max()))
            for signed, a, r in zip((True, False), astate, rstate):
                if isinstance(r, tuple) != isinstance(a, tuple):
                    raise AssertionError(f"{fmt} {dtype} {k}: layouts differ")
                if not isinstance(r, tuple):
                    fig["plain"] = max(fig["plain"], rel(a, r))
                    continue
                codes, scale, scaled, last = r
                fig["codes_total"] += codes.size
                fig["codes"] += int(np.sum(a[0] != codes))
                fig["tie"] += ties(fmt, signed, a[0], codes, scaled, last, scale, block)
                fig["scale"] = max(fig["scale"], rel(a[1], scale))
    fig["ok"] = (
        fig["codes"] == fig["tie"]
        and fig["scale"] <= RTOL
        and fig["param"] <= RTOL
        and fig["plain"] <= RTOL
    )
    return fig


def report(rows, model):
    """One line per row; only the rows with torch's own `sqrt` (`model`) count."""
    for (fmt, dtype, sqrt), f in rows.items():
        verdict = ("ok" if f["ok"] else "FAIL") if sqrt == model else "(other sqrt)"
        print(
            f"{fmt:5s} {dtype:9s} {sqrt:10s} codes {f['codes']}/{f['codes_total']}"
            f" differ ({f['tie']} ties)  scales {f['scale']:.2e}  plain"
            f" {f['plain']:.2e}  params {f['param']:.2e} ({f['param_neq']} differ,"
            f" <= {f['param_ulp']} float32 ulp)"
            f"  {verdict}"
        )
    return all(f["ok"] for (_, _, sqrt), f in rows.items() if sqrt == model)


def check_maps():
    """The transcription's maps and `torch.linspace` against torchao's."""
    import torch  # pyright: ignore[reportMissingImports]
    from torchao.optim import (  # pyright: ignore[reportMissingImports]
        subclass_4bit,
        subclass_8bit,
    )

    # torch.linspace's kernel is fused (one rounding) except in ATen's DEFAULT build
    cap = torch.backends.cpu.get_cpu_capability()
    fused = cap != "DEFAULT"
    for n in range(2, 300):
        for lo, hi in ((0.1, 1.0), (0.0, 1.0), (-1.0, 1.0)):
            ours = tt.np_linspace(lo, hi, n, fused)
            assert np.array_equal(ours, torch.linspace(lo, hi, n).numpy()), (lo, hi, n)
    differ = []
    for mod, fmt in ((subclass_8bit, "int8"), (subclass_4bit, "int4")):
        for signed, get in (
            (True, mod.get_qmap_signed),
            (False, mod.get_qmap_unsigned),
        ):
            theirs = np.asarray(get(), np.float64).astype(np.float32)
            assert np.array_equal(np.asarray(get(), np.float64), theirs), (fmt, signed)
            if fmt == "int8":
                ours = tt.np_create_dynamic_map(signed, fused=fused)
            else:
                ours = tt.QMAPS[fmt, signed]
            assert np.array_equal(ours, theirs), (fmt, signed)
            differ.append(int(np.sum(tt.QMAPS[fmt, signed] != theirs)))
    print(
        f"maps ({cap}): torch.linspace {'fused' if fused else 'unfused'}, torchao's 4"
        f" maps equal the transcription's of that kind; QMAPS differ in {differ}"
    )


def main_torch(args):
    import torch  # pyright: ignore[reportMissingImports]
    import torchao  # pyright: ignore[reportMissingImports]

    torch.manual_seed(0)
    print(f"torch {torch.__version__}, torchao {torchao.__version__}, ", end="")
    print(f"compile={'on' if args.compile else 'off'}, {STEPS} steps")
    check_maps()
    rows, saved = {}, {}

    def torch_sqrt(x):
        return torch.from_numpy(np.array(x, np.float32)).sqrt().numpy()

    for dname, dtype in DTYPES.items():
        params, grads = make_inputs(dtype)
        for fmt in FORMATS:
            ao = run_torchao(fmt, dtype, params, grads, args.compile)
            fused = not args.compile  # torch.compile's lerp is not fused
            ref = run_transcription(fmt, dtype, params, grads, np.sqrt, fused)
            rows[fmt, dname, "np.sqrt"] = compare(fmt, dname, ao, ref)
            ref = run_transcription(fmt, dtype, params, grads, torch_sqrt, fused)
            rows[fmt, dname, "torch.sqrt"] = compare(fmt, dname, ao, ref)
            for k in SHAPES:
                saved[f"{dname}/params/{k}"] = params[k].astype(np.float32)
                for t, g in enumerate(grads):
                    saved[f"{dname}/grads/{t}/{k}"] = g[k].astype(np.float32)
                for t, step in enumerate(ao):
                    p, state = step[k]
                    saved[f"{fmt}/{dname}/{t}/{k}/param"] = p
                    for name, s in zip(("mu", "nu"), state):
                        if isinstance(s, tuple):
                            saved[f"{fmt}/{dname}/{t}/{k}/{name}/codes"] = s[0]
                            saved[f"{fmt}/{dname}/{t}/{k}/{name}/scale"] = s[1]
    if args.save:
        np.savez_compressed(args.save, **saved)
    # eager float32 sqrt is MKL's; inductor's C++ is correctly rounded, as NumPy's
    return report(rows, "np.sqrt" if args.compile else "torch.sqrt")


def main_eqxopt(path):
    """eqxopt on the inputs of `--save`, against torchao's outputs. The `odd` leaf's
    moments are quantized (zero-padded) by eqxopt and plain in torchao, so it is
    left out."""
    import equinox as eqx
    import jax.numpy as jnp

    import eqxopt

    data = np.load(path)
    rows = {}
    leaves = [k for k in SHAPES if k != "odd"]
    for dname, dtype in DTYPES.items():
        for fmt in FORMATS:
            opt = eqxopt.AdamW(
                LR, B1, B2, EPS, weight_decay=WD, state_dtype=eqxopt.Quantized(fmt)
            )
            params = {
                k: jnp.asarray(data[f"{dname}/params/{k}"].reshape(SHAPES[k]), dtype)
                for k in leaves
            }
            state = opt.init(params)
            step = eqx.filter_jit(opt.step)
            fig = dict(codes=0, codes_total=0, tie=0, scale=0.0, plain=0.0, param=0.0)
            fig["param_neq"] = 0
            for t in range(STEPS):
                grads = {
                    k: jnp.asarray(data[f"{dname}/grads/{t}/{k}"].reshape(SHAPES[k]))
                    for k in leaves
                }
                params, state = step(params, grads, state)
                for k in leaves:
                    ours = np.asarray(params[k], np.float32).reshape(-1)
                    theirs = data[f"{fmt}/{dname}/{t}/{k}/param"]
                    fig["param"] = max(fig["param"], rel(ours, theirs))
                    d = float(np.abs(ours - theirs).max())
                    fig["param_abs"] = max(fig.get("param_abs", 0.0), d)
                    fig["param_neq"] += int(np.sum(ours != theirs))
                    for name in ("mu", "nu"):
                        buf = getattr(state, name)[k]
                        key = f"{fmt}/{dname}/{t}/{k}/{name}"
                        if f"{key}/codes" not in data:
                            continue
                        codes = np.asarray(buf.codes).reshape(-1)
                        if fmt == "int4":
                            codes = np.stack([codes >> 4, codes & 15], -1).reshape(-1)
                        theirs = data[f"{key}/codes"]
                        fig["codes_total"] += theirs.size
                        fig["codes"] += int(np.sum(codes != theirs))
                        scale = np.asarray(buf.scales).reshape(-1)
                        fig["scale"] = max(
                            fig["scale"], rel(scale, data[f"{key}/scale"])
                        )
            fig["ok"] = True  # reported only: eqxopt's EMA is not torch's lerp
            rows[fmt, dname] = fig
    print("eqxopt against torchao (leaves w, small, zeros; ties not classed):")
    for (fmt, dname), f in rows.items():
        print(
            f"{fmt:5s} {dname:9s} codes {f['codes']}/{f['codes_total']} differ"
            f"  scales {f['scale']:.2e}  params {f['param']:.2e}"
            f" ({f['param_neq']} differ; largest by {f['param_abs']:.1e},"
            f" {f['param_abs'] / LR:.1e} lr)"
        )
    return True


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--save")
    parser.add_argument("--eqxopt")
    args = parser.parse_args()
    ok = main_eqxopt(args.eqxopt) if args.eqxopt else main_torch(args)
    sys.exit(0 if ok else 1)
