"""A NumPy transcription of torchao's blockwise-quantized AdamW (`torchao/optim/`), the
reference for `eqxopt.Quantized` in `tests/test_quantized.py` and, against torchao
itself, in `tests/torchao_check.py`.

It imports NumPy and `ml_dtypes` only (no JAX, no torch), so that both can use it.
The transcription follows pytorch/ao at commit 173b31e (`torchao/optim/
quant_utils.py`) and 0372e5f (`torchao/optim/adam.py`); line numbers are those
files'. In torchao 0.18.0, against which `tests/torchao_check.py` checked it, the
same code is one line lower in quant_utils.py (`create_dynamic_map` L13-61,
`scale_tensor` L64-72, `quantize_8bit_with_qmap` L75-94, `quantize_4bit_with_qmap`
L97-112, `dequant_with_qmap` L115-118), the maps are `get_qmap_signed` /
`get_qmap_unsigned` (subclass_8bit.py L30-37, subclass_4bit.py L34-41), fp8 is
`quantize_fp8` (subclass_fp8.py L22-28), and adam.py has `_new_buffer` at L71-99
(L75: quantized only when `numel() >= 4096 and numel() % block_size == 0`) and
`single_param_adam` at L163-209. The floating-point detail is torch's on CPU, as
that check found it: `linspace` and `lerp` each one fused multiply-add (one
rounding), `lr * weight_decay` a float32 product (`lr` is a float32 tensor).
"""

from fractions import Fraction

import ml_dtypes
import numpy as np


def np_linspace(start, end, steps, fused=True):
    """`torch.linspace(start, end, steps)` in float32 (ATen's CPU kernel
    `RangeFactoriesKernel.cpp`: from `start` up to the half-way index, from `end`
    down after it). The kernel's `start + step * idx` is one fused multiply-add (one
    rounding) in PyTorch's AVX2 and AVX512 builds of the kernel, which any x86-64 CPU
    of the last decade runs (checked against torch 2.13.0 on CPU); `fused=False` is
    two roundings, as its DEFAULT build (`ATEN_CPU_CAPABILITY=default`) computes it.
    The two differ in 42 values of the signed 8-bit map and 31 of the unsigned, by one
    float32 ulp; the 4-bit maps are the same."""
    start, end = np.float32(start), np.float32(end)
    step = np.float32((end - start) / np.float32(steps - 1))
    out = np.empty(steps, np.float32)
    for i in range(steps):
        base, k = (start, i) if i < steps // 2 else (end, -(steps - i - 1))
        if fused:
            # step * k is exact in float64, and so is the sum for these ranges
            # (checked): one rounding to float32, a fused multiply-add's.
            exact = Fraction(float(base)) + Fraction(float(step)) * k
            wide = np.float64(base) + np.float64(step) * np.float64(k)
            assert Fraction(float(wide)) == exact
            out[i] = np.float32(wide)
        else:
            out[i] = base + step * np.float32(k)
    return out


def np_create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8, fused=True):
    """quant_utils.py L12-60, `create_dynamic_map` (bitsandbytes' map, no padding).
    `(10 ** k) * means` is a float32 tensor product in torch (L43, L45)."""
    data = []
    non_sign_bits = total_bits - (1 if signed else 1)  # L33
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1  # L34
    i = 0
    for i in range(max_exponent_bits):  # L35-45
        fraction_items = int(
            2 ** (i + non_sign_bits - max_exponent_bits) + 1
            if signed
            else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1
        )
        boundaries = np_linspace(0.1, 1, fraction_items, fused)
        means = (boundaries[:-1] + boundaries[1:]) / np.float32(2.0)
        factor = np.float32(10 ** (-(max_exponent_bits - 1) + i))
        data += list(factor * means)
        if signed:
            data += list(np.float32(-factor) * means)
    if additional_items > 0:  # L47-52
        boundaries = np_linspace(0.1, 1, additional_items + 1, fused)
        means = (boundaries[:-1] + boundaries[1:]) / np.float32(2.0)
        factor = np.float32(10 ** (-(max_exponent_bits - 1) + i))
        data += list(factor * means)
        if signed:
            data += list(np.float32(-factor) * means)
    data.append(0)  # L54-55
    data.append(1.0)
    assert len(data) == 2**total_bits  # L57
    data.sort()  # L59
    return np.asarray(data, np.float32)


QMAPS = {
    # subclass_8bit.py: `create_dynamic_map(signed)` with the defaults (7, 8)
    ("int8", True): np_create_dynamic_map(True),
    ("int8", False): np_create_dynamic_map(False),
    # subclass_4bit.py L34-40: `create_dynamic_map(True, 3, 4)` and
    # `torch.linspace(0, 1, 17)[1:]` ("no zero")
    ("int4", True): np_create_dynamic_map(True, 3, 4),
    ("int4", False): np_linspace(0, 1, 17)[1:],
}


def np_scale_tensor(x, block_size):
    """quant_utils.py L63-71: per block, scale = absmax clipped at 1e-12."""
    x = x.reshape(-1, block_size)
    scale = np.maximum(np.abs(x).max(-1), np.float32(1e-12)).astype(np.float32)
    return (x / scale[:, None]).astype(np.float32), scale


def np_quantize_with_qmap(x, qmap):
    """quant_utils.py L74-93 (8-bit) and L96-111 (4-bit): the branchless binary
    search, then up one code when `residual >= (up - down) * 0.5`."""
    n = qmap.shape[0]
    half = n // 2
    codes = np.where(x >= qmap[half], half, 0)
    step = half // 2
    while step >= 1:
        codes = codes + np.where(x >= qmap[codes + step], step, 0)
        step //= 2
    codes_up = np.minimum(codes + 1, n - 1)
    val_down, val_up = qmap[codes], qmap[codes_up]
    residual = x - val_down
    codes = np.where(residual >= (val_up - val_down) * np.float32(0.5), codes_up, codes)
    return codes.astype(np.uint8)


def np_dequant(codes, qmap, scale):
    """quant_utils.py L114-117."""
    return (
        qmap[codes.astype(np.int32)].reshape(scale.shape[0], -1) * scale[:, None]
    ).reshape(-1)


def np_quantize_fp8(x, block_size):
    """subclass_fp8.py `quantize_fp8`: scale = absmax.clip(1e-12) / 448, codes =
    (x / scale) cast to float8_e4m3fn."""
    x = x.reshape(-1, block_size)
    scale = (np.maximum(np.abs(x).max(-1), np.float32(1e-12)) / np.float32(448)).astype(
        np.float32
    )
    codes = (x / scale[:, None]).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    return codes.view(np.uint8), scale


class NpBuffer:
    """One buffer of torchao's `_new_buffer` (adam.py L78-84): quantized (codes 0,
    scales 0) when the leaf has >= 4096 values, else plain zeros in the param's dtype.
    With `pad` (eqxopt's rule, API.md section 8), a leaf that is not a multiple of the
    block is quantized with a zero-padded last block; without it (torchao's rule,
    `numel() % block_size == 0` in the same condition) such a leaf stays plain."""

    def __init__(self, shape, dtype, fmt, signed, block, pad=True):
        self.size = int(np.prod(shape))
        self.fmt, self.signed, self.block = fmt, signed, block
        self.quantized = self.size >= 4096 and (pad or self.size % block == 0)
        if self.quantized:
            blocks = -(-self.size // block)
            self.codes = np.zeros(blocks * block, np.uint8)
            self.scale = np.zeros(blocks, np.float32)
            self.scaled = None
        else:
            self.plain = np.zeros(shape, dtype)

    def value(self):
        if not self.quantized:
            return self.plain.astype(np.float32).reshape(-1)
        if self.fmt == "fp8":
            v = self.codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
            out = (v.reshape(self.scale.shape[0], -1) * self.scale[:, None]).reshape(-1)
        else:
            out = np_dequant(self.codes, QMAPS[self.fmt, self.signed], self.scale)
        return out[: self.size]

    def copy_(self, x):
        """`copy_` of a float32 tensor into the buffer (subclass_*bit.py)."""
        if not self.quantized:
            self.plain = x.astype(self.plain.dtype).reshape(self.plain.shape)
            return
        padded = np.zeros(self.codes.shape[0], np.float32)
        padded[: self.size] = x
        if self.fmt == "fp8":
            self.codes, self.scale = np_quantize_fp8(padded, self.block)
            self.codes = self.codes.reshape(-1)
        else:
            scaled, self.scale = np_scale_tensor(padded, self.block)
            self.scaled = scaled.reshape(-1)
            self.codes = np_quantize_with_qmap(
                self.scaled, QMAPS[self.fmt, self.signed]
            )


def np_fma_f32(a, b, c):
    """`a * b + c` of float32 arrays, rounded once to float32 (a fused multiply-add):
    the product is exact in float64, the sum is rounded to float64 and, where that
    lands on a float32 rounding tie that the exact sum is not, moved off it towards
    the exact sum (TwoSum's error), so the rounding to float32 is the exact sum's.
    (Results in float32's subnormal range are not corrected; none arise here.)"""
    prod = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c = np.asarray(c, np.float64)
    s = prod + c
    bp = s - c
    err = (c - (s - bp)) + (prod - bp)
    tie = (s.view(np.uint64) & np.uint64((1 << 29) - 1)) == np.uint64(1 << 28)
    toward = np.where(err > 0, np.inf, -np.inf)
    s = np.where(tie & (err != 0), np.nextafter(s, toward), s)
    return s.astype(np.float32)


def np_lerp(a, b, w, fused=True):
    """`torch.lerp` on CPU for a weight < 0.5: `a + w * (b - a)` in float32, with
    `b - a` rounded and then one fused multiply-add (ATen's vectorized lerp kernel,
    `fmadd`; checked against torch 2.13.0 on CPU). `fused=False` rounds the product
    and the sum apart."""
    a, b, w = np.asarray(a, np.float32), np.asarray(b, np.float32), np.float32(w)
    if fused:
        return np_fma_f32(w, (b - a).astype(np.float32), a)
    return (a + w * (b - a)).astype(np.float32)


def np_adamw_step(
    p, g, step, exp_avg, exp_avg_sq, lr, b1, b2, wd, eps, sqrt=np.sqrt, fused=True
):
    """adam.py `single_param_adam` (IS_ADAMW, no amsgrad): returns the new float32
    params and writes the buffers. `sqrt` is NumPy's, correctly rounded; torch's
    eager float32 `sqrt` on CPU is MKL's `vmsSqrt` (VML_HA), one ulp off it for about
    one value in six (torch 2.13.0), which `tests/torchao_check.py` passes in to
    compare bit for bit. `fused` is `np_lerp`'s: eager torch's lerp is fused, the
    code `torch.compile` makes of it on CPU is not."""
    p32, g32 = p.astype(np.float32).reshape(-1), g.astype(np.float32).reshape(-1)
    p32 = p32 - (np.float32(lr) * np.float32(wd)) * p32  # lr: a float32 tensor
    bc1 = np.float32(1) - np.float32(b1) ** np.float32(step)
    bc2 = np.float32(1) - np.float32(b2) ** np.float32(step)
    m = np_lerp(exp_avg.value(), g32, 1 - b1, fused)
    v = np_lerp(exp_avg_sq.value(), g32 * g32, 1 - b2, fused)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)
    denom = sqrt(v) / sqrt(bc2) + np.float32(eps)
    return (p32 - np.float32(lr) * (m / bc1) / denom).astype(np.float32)
