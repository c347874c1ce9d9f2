r"""How a state buffer that mirrors a param is stored (docs/memory_precision.md): in
a dtype, or blockwise quantized as a [`eqxopt.QuantizedArray`][].

An optimizer declares its param-mirroring buffers once (`_state_buffers`: each
buffer's field name and whether it is non-negative); its `state_dtype` (a dtype,
`None`, a [`eqxopt.Quantized`][] or a dict keyed by those names) is checked against
them at construction, and its per-leaf rule goes through one read/write pair:
`read(buffer)` gives the values to compute with (a quantized buffer decoded to
float32), `write(new, buffer)` stores the new values back as the old buffer was
stored (a dtype cast, or a re-encoding). For plain dtypes both are the casts the
optimizers always made, so their numbers are unchanged bit for bit.

The encodings are torchao's (`torchao/optim/quant_utils.py`, `subclass_8bit.py`,
`subclass_4bit.py`, `subclass_fp8.py`): per block, the absmax (clipped below at
1e-12) is the scale; int8 and int4 round `x / scale` to the nearest entry of a
quantization map with torchao's branchless binary search and its tie rule (computed
here, code for code, by two look-ups in tables built from that search), fp8 casts
`x / (absmax / 448)` to `float8_e4m3fn` (here in integer arithmetic, bit for bit).
"""

import dataclasses
import functools as ft
import math
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.lax as lax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from jaxtyping import Array, Float32, Inexact, UInt8

from ._misc import (
    explicit_sharding,
    full_like_leaf,
    OpaqueLeaf,
    tree_map,
    typechecked,
)


FORMATS = ("int8", "int4", "fp8")
_DEFAULT_BLOCK = {"int8": 256, "int4": 128, "fp8": 256}
_FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


@dataclasses.dataclass(frozen=True)
class Quantized:
    r"""Blockwise-quantized storage for the state buffers that mirror params: pass it
    as `state_dtype` (or as one entry of a per-buffer dict `state_dtype`, or as
    `MultiSteps`' `accumulator_dtype`).

    - `"int8"` (block 256): one byte per value, the dynamic quantization maps of
      bitsandbytes' 8-bit optimizers (signed for a moment that changes sign,
      unsigned for a non-negative one), as torchao's `AdamW8bit`.
    - `"int4"` (block 128): two values per byte, torchao's `AdamW4bit` maps (a
      3-exponent-bit dynamic map for signed buffers, the linear map
      $\{1/16, \dots, 1\}$ for non-negative ones; Li et al. 2023).
    - `"fp8"` (block 256): `float8_e4m3fn` values stored as their uint8 bit patterns,
      as torchao's `AdamWFp8`.

    Each block of `block_size` values keeps one float32 scale, its absolute maximum.
    Leaves with fewer than `min_size` elements (and complex leaves) stay in the param's
    dtype; a leaf whose size is not a multiple of `block_size` gets a zero-padded last
    block.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((256, 64)), "b": jnp.zeros(64)}
        opt = eqxopt.AdamW(1e-3, state_dtype=eqxopt.Quantized("int8"))
        state = opt.init(params)
        assert isinstance(state.mu["w"], eqxopt.QuantizedArray)
        assert state.mu["b"].dtype == params["b"].dtype  # under `min_size`: as is
        ```
    """

    format: str = "int8"
    block_size: int | None = None
    min_size: int = 4096

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(
                "`Quantized(format=...)` must be one of 'int8', 'int4', 'fp8', got "
                f"{self.format!r}."
            )
        b = self.block_size
        if b is not None and (
            isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b <= 0
        ):
            raise ValueError(
                "`Quantized(block_size=...)` must be an integer > 0 or None, "
                f"got {b!r}."
            )
        if self.format == "int4" and b is not None and b % 2:
            raise ValueError(
                "`Quantized(block_size=...)` must be even for 'int4' (two codes per "
                f"byte), got {b!r}."
            )
        m = self.min_size
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0:
            raise ValueError(
                f"`Quantized(min_size=...)` must be an integer >= 0, got {m!r}."
            )

    @property
    def block(self) -> int:
        """The block size in use: `block_size`, or the format's default."""
        return self.block_size or _DEFAULT_BLOCK[self.format]


Quantized.__init__.__doc__ = """**Arguments:**

- `format`: `"int8"`, `"int4"` or `"fp8"`.
- `block_size`: values per float32 scale; `None` means the format's default (256 for
    int8 and fp8, 128 for int4).
- `min_size`: leaves with fewer elements stay unquantized, in the param's dtype.
"""


@typechecked
class QuantizedArray(OpaqueLeaf):
    """A blockwise-quantized state buffer (see [`eqxopt.Quantized`][]): one per param
    leaf, standing where a buffer of the param's shape would.

    - `codes`: `uint8[blocks, block_size]` (int8: one map index per value; fp8: the
      `float8_e4m3fn` bit patterns), or `uint8[blocks, block_size // 2]` for int4 (two
      map indices per byte, the even element in the high nibble).
    - `scales`: `float32[blocks]`, each block's absolute maximum (fp8: divided by 448).
    - `shape`, `format`, `signed`: the param's shape, the format, and whether the
      signed map is used (static).

    `decode()` returns the float32 values, of shape `shape`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((300, 20))}
        opt = eqxopt.AdamW(1e-3, state_dtype=eqxopt.Quantized("int4"))
        state = opt.init(params)
        mu = state.mu["w"]  # 6000 values: 47 blocks of 128, two codes per byte
        assert mu.codes.shape == (47, 64) and mu.scales.shape == (47,)
        assert mu.decode().shape == (300, 20)
        ```
    """

    codes: UInt8[Array, "blocks nbytes"]
    scales: Float32[Array, " blocks"]
    shape: tuple[int, ...] = eqx.field(static=True)
    format: str = eqx.field(static=True)
    signed: bool = eqx.field(static=True)

    @property
    def block_size(self) -> int:
        n = self.codes.shape[1]
        return 2 * n if self.format == "int4" else n

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def decode(self) -> Float32[Array, "..."]:
        """The stored values as float32, of the param's shape."""
        return _decode(self.codes, self.scales, self.shape, self.format, self.signed)


# The annotation of a state field holding param-mirroring buffers.
Stored = Inexact[Array, "..."] | QuantizedArray


# Encoding and decoding are traced once per shape, dtype and format and the trace is
# reused (`jax.jit(..., inline=True)`: the cached jaxpr is inlined into the caller's,
# so the compiled program is the same as without): a model's many leaves of one shape,
# and every step function that reads or writes them, then cost one trace, not one each.
@ft.partial(jax.jit, static_argnums=(2, 3, 4), inline=True)
def _decode(
    codes: Array, scales: Array, shape: tuple[int, ...], format: str, signed: bool
) -> Array:
    """[`QuantizedArray.decode`][]'s values: float32, of `shape`."""
    size = math.prod(shape)
    if format == "fp8":
        values = _fp8_decode(codes)
    else:
        indices = codes
        if format == "int4":  # unpack: high nibble first (torchao)
            indices = jnp.stack([codes >> 4, codes & 0b1111], axis=-1)
            indices = indices.reshape(codes.shape[0], -1)
        values = _look_up(qmap(format, signed), indices)
    out = values * scales[:, None]
    split = _split_axes(codes)
    if split is None:  # the usual case: codes not sharded in their type
        return out.reshape(-1)[:size].reshape(shape)
    # Sharding in types: the blocks of a split buffer are its param's rows.
    rest = (None,) * (len(shape) - 1)
    flat = _reshape(out, (-1,), PartitionSpec(split) if split else None)
    return _reshape(flat[:size], shape, PartitionSpec(split, *rest))


# --- quantization maps --------------------------------------------------------------


def _linspace_f32(start: float, end: float, steps: int) -> np.ndarray:
    """`torch.linspace(start, end, steps)` in float32, as PyTorch's CPU kernel computes
    it (from both ends towards the middle), with `start + step * i` one fused
    multiply-add (a single rounding), as in its AVX2 / AVX512 builds, which torchao's
    maps come from on any recent x86-64 CPU (checked against torch 2.13.0 by
    tests/torchao_check.py)."""
    start32, end32 = np.float32(start), np.float32(end)
    step = np.float64(np.float32((end32 - start32) / np.float32(steps - 1)))
    idx = np.arange(steps)
    base = np.where(idx < steps // 2, start32, end32).astype(np.float64)
    prod = step * np.where(idx < steps // 2, idx, idx - steps + 1)  # exact
    wide = base + prod
    # exact in float64 (so one rounding to float32) for these ranges; checked
    assert np.all(wide - base == prod) and np.all(wide - prod == base)
    return wide.astype(np.float32)


def _dynamic_map(signed: bool, max_exponent_bits: int, total_bits: int) -> np.ndarray:
    """bitsandbytes' `create_dynamic_map`, as torchao copies it (without the zero
    padding), in float32."""
    data: list[np.ndarray] = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    i = 0
    for i in range(max_exponent_bits):
        items = 2 ** (i + non_sign_bits - max_exponent_bits + (0 if signed else 1)) + 1
        bounds = _linspace_f32(0.1, 1.0, items)
        means = (bounds[:-1] + bounds[1:]) / np.float32(2.0)
        factor = np.float32(10.0 ** (-(max_exponent_bits - 1) + i))
        data.append(factor * means)
        if signed:
            data.append(-factor * means)
    if additional_items > 0:
        bounds = _linspace_f32(0.1, 1.0, additional_items + 1)
        means = (bounds[:-1] + bounds[1:]) / np.float32(2.0)
        factor = np.float32(10.0 ** (-(max_exponent_bits - 1) + i))
        data.append(factor * means)
        if signed:
            data.append(-factor * means)
    data.append(np.array([0.0, 1.0], np.float32))
    return np.sort(np.concatenate(data).astype(np.float32))


_QMAPS: dict[tuple[str, bool], np.ndarray] = {}


def qmap(format: str, signed: bool) -> np.ndarray:
    """The quantization map (sorted float32 values) of `format` (int8 or int4)."""
    key = (format, signed)
    if key not in _QMAPS:
        if format == "int8":
            out = _dynamic_map(signed, 7, 8)
        elif signed:
            out = _dynamic_map(True, 3, 4)
        else:
            out = _linspace_f32(0.0, 1.0, 17)[1:]  # no zero (torchao's AdamW4bit)
        out.setflags(write=False)
        _QMAPS[key] = out
    return _QMAPS[key]


# --- encoding -----------------------------------------------------------------------


def _search(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """torchao's `quantize_{8,4}bit_with_qmap` in NumPy (float32): the branchless
    binary search for the largest entry <= `x`, then up one code when `x` is at least
    half-way to the next entry (its tie rule, rounding included)."""
    n = table.shape[0]
    half = n // 2
    codes = np.where(x >= table[half], half, 0)
    step = half // 2
    while step >= 1:
        codes = codes + np.where(x >= table[codes + step], step, 0)
        step //= 2
    up = np.minimum(codes + 1, n - 1)
    down_value, up_value = table[codes], table[up]
    half_gap = (up_value - down_value) * np.float32(0.5)
    return np.where(x - down_value >= half_gap, up, codes)


def _ordered(x: Any) -> np.ndarray:
    """float32 -> int64, in the order of the values (-0.0 and 0.0 apart)."""
    i = np.asarray(x, np.float32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF) - 1, i)


def _unordered(k: Any) -> np.ndarray:
    """The inverse of [`_ordered`][]."""
    k = np.asarray(k, np.int64)
    bits = np.where(k < 0, (-(k + 1)) | 0x80000000, k).astype(np.uint32)
    return bits.view(np.float32)


_LOOKUPS: dict[tuple[str, bool], tuple[np.ndarray, np.ndarray]] = {}


def _lookup(format: str, signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Tables that give [`_search`][]'s code of any float32 `x` in two look-ups,
    keyed by the top 16 bits of `x`: `base` (the code at the bucket's lowest value)
    and `step` (the one value in the bucket where the code goes up by one; NaN if
    none). Built once per map from `_search` itself: for each code `j`, the smallest
    float32 whose code is at least `j`, found by bisection over the float32 values."""
    key = (format, signed)
    if key not in _LOOKUPS:
        table = qmap(format, signed)
        n = table.shape[0]
        target = np.arange(1, n)
        lo = np.full(n - 1, _ordered(np.float32(-np.inf)), np.int64)
        hi = np.full(n - 1, _ordered(np.float32(np.inf)), np.int64)
        while np.any(hi - lo > 1):  # invariant: code(lo) < j <= code(hi)
            mid = (lo + hi) // 2
            ok = _search(_unordered(mid), table) >= target
            hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid)
        rises = _unordered(hi)  # code(x) = number of `rises` <= x, for non-NaN x
        assert np.all(np.diff(_ordered(rises)) >= 0)
        # Bucket b holds the floats whose top 16 bits are b: one interval of values.
        buckets = np.arange(1 << 16, dtype=np.uint32) << 16
        ends = np.stack([buckets, buckets | 0xFFFF]).view(np.float32)
        low = np.where(buckets >> 31 == 1, ends[1], ends[0])
        base = np.searchsorted(_ordered(rises), _ordered(low), side="right")
        step = np.full(1 << 16, np.nan, np.float32)
        for r in rises:
            b = int(r.view(np.uint32) >> 16)
            if _ordered(r) > _ordered(low[b]):
                assert np.isnan(step[b]), "two code boundaries in one bucket"
                step[b] = r
        base = np.where(np.isnan(low), 0, base).astype(np.uint8)
        base.setflags(write=False)
        step.setflags(write=False)
        _LOOKUPS[key] = (base, step)
    return _LOOKUPS[key]


def _nearest_code(x: Array, format: str, signed: bool) -> Array:
    """torchao's nearest code of `x` ([`_search`][]) in the map of `format`, bit for
    bit, as two table look-ups (see [`_lookup`][]) rather than eight dependent ones;
    NaN gets code 0, as in torchao."""
    base, step = _lookup(format, signed)
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    bucket = lax.shift_right_logical(bits, jnp.uint32(16))
    bucket = bucket.astype(jnp.int32)
    codes = _look_up(base, bucket) + (x >= _look_up(step, bucket)).astype(jnp.uint8)
    return jnp.where(jnp.isnan(x), jnp.uint8(0), codes)


def _fp8_values() -> np.ndarray:
    """The float32 value of each of the 256 `float8_e4m3fn` bit patterns."""
    bits = np.arange(256, dtype=np.uint8)
    return bits.view(np.dtype(jnp.float8_e4m3fn)).astype(np.float32)


def _fp8_decode(codes: Array) -> Array:
    """The float32 values of `float8_e4m3fn` bit patterns (`_fp8_values()[codes]`, bit
    for bit), in integer arithmetic: a table look-up per value is a gather, which XLA
    keeps out of the fusions that use the values."""
    bits = codes.astype(jnp.uint32)
    sign, exponent, mantissa = bits >> 7, (bits >> 3) & 0b1111, bits & 0b111
    # Normal values: the exponent re-biased 7 -> 127, the mantissa's 3 bits on top.
    normal = (sign << 31) | ((exponent + 120) << 23) | (mantissa << 20)
    normal = lax.bitcast_convert_type(normal, jnp.float32)
    # Exponent field 0: subnormal, mantissa x 2^-9.
    subnormal = mantissa.astype(jnp.float32) * (2.0**-9)
    subnormal = jnp.where(sign == 1, -subnormal, subnormal)
    values = jnp.where(exponent == 0, subnormal, normal)
    return jnp.where(bits & 0x7F == 0x7F, jnp.float32(jnp.nan), values)


def _look_up(table: np.ndarray, index: Array) -> Array:
    """`table[index]` for indices known to be in range (uint8 codes into a table of
    256 or fewer entries, 16-bit buckets into one of 65,536): no clamping."""
    index = index.astype(jnp.int32)
    # Indices sharded over `Explicit` mesh axes: the result is sharded as they are
    # (the table is replicated).
    return (
        jnp.asarray(table)
        .at[index]
        .get(mode="promise_in_bounds", out_sharding=explicit_sharding(index))
    )


def _absmax(blocks: Array) -> Array:
    """Each row's largest absolute value (NaN if the row holds one), as the largest
    of the float32 bit patterns with the sign bit cleared, which order as the absolute
    values do. Computed as a max over chunks of 32 and then over the chunks, kept
    apart by an optimization barrier: XLA then computes the row's values inside the
    reduction, where a single max over a long row would first store them all (a
    float reduction goes to a library kernel, a long integer one is split into a
    `reduce-window`, and neither fuses its operand)."""
    bits = lax.bitcast_convert_type(blocks, jnp.int32) & 0x7FFFFFFF
    rows, width = bits.shape
    if width > 32 and width % 32 == 0:
        bits = jnp.max(bits.reshape(rows, width // 32, 32), axis=2)
        bits = lax.optimization_barrier(bits)
    return lax.bitcast_convert_type(jnp.max(bits, axis=1), jnp.float32)


def _fp8_bits(y: Array) -> Array:
    """The bit patterns of `y.astype(float8_e4m3fn)` (round to nearest even; NaN
    beyond the largest value, 448), in integer arithmetic on the float32 bits: the
    cast itself runs as slower emulation on CPU."""
    bits = lax.bitcast_convert_type(y, jnp.uint32)
    sign = (bits >> 31).astype(jnp.uint8) << 7
    a = bits & jnp.uint32(0x7FFFFFFF)
    # Normal values: the mantissa rounded to 3 bits, the exponent re-biased 127 -> 7.
    rounded = a + jnp.uint32(0x7FFFF) + ((a >> 20) & jnp.uint32(1))
    normal = jnp.minimum((rounded >> 20) - jnp.uint32(120 << 3), jnp.uint32(0x7F))
    # Below 2^-6, subnormal: multiples of 2^-9, rounded to nearest even.
    magnitude = lax.bitcast_convert_type(a, jnp.float32)
    subnormal = jnp.round(magnitude * 512.0).astype(jnp.uint32)
    out = jnp.where(a < jnp.uint32(0x3C800000), subnormal, normal)
    out = jnp.where(jnp.isnan(y), jnp.uint32(0x7F), out)
    return sign | out.astype(jnp.uint8)


def encode(x: Array, like: QuantizedArray) -> QuantizedArray:
    """`x` (of `like.shape`) quantized in `like`'s format, block size and map."""
    codes, scales = _encode(x, like.block_size, like.format, like.signed)
    return QuantizedArray(codes, scales, like.shape, like.format, like.signed)


@ft.partial(jax.jit, static_argnums=(1, 2, 3), inline=True)  # (see `_decode`)
def _encode(x: Array, block: int, format: str, signed: bool) -> tuple[Array, Array]:
    """[`encode`][]'s codes and scales of `x` in blocks of `block`."""
    flat = _flatten(x.astype(jnp.float32), block)
    whole = flat.shape[0] // block * block
    if whole == flat.shape[0]:
        split = _split_axes(flat)
        blocks = _reshape(flat, (-1, block), PartitionSpec(split) if split else None)
        return _encode_blocks(blocks, format, signed)
    # The whole blocks and the zero-padded last one apart: padding the whole
    # buffer would make XLA store the padded values before encoding them.
    last = jnp.concatenate(
        [flat[whole:], jnp.zeros(whole + block - flat.shape[0], jnp.float32)]
    )
    parts = [_encode_blocks(last[None], format, signed)]
    if whole:
        parts.insert(0, _encode_blocks(flat[:whole].reshape(-1, block), format, signed))
    codes, scales = (jnp.concatenate(p) for p in zip(*parts))
    return codes, scales


def _encode_blocks(blocks: Array, format: str, signed: bool) -> tuple[Array, Array]:
    """The codes and scales of `[blocks, block_size]` float32 values."""
    absmax = _absmax(blocks)
    if format == "fp8":
        scales = jnp.maximum(absmax, 1e-12) / _FP8_MAX
        codes = _fp8_bits(blocks / scales[:, None])
    else:
        scales = jnp.maximum(absmax, 1e-12)
        codes = _nearest_code(blocks / scales[:, None], format, signed)
        if format == "int4":
            codes = (codes[:, 0::2] << 4) | codes[:, 1::2]
    return codes, scales


def empty(shape: tuple[int, ...], spec: Quantized, signed: bool) -> QuantizedArray:
    """A new buffer as torchao makes it: codes 0 and scales 0 (it decodes to 0)."""
    size = math.prod(shape)
    blocks = -(-size // spec.block)
    width = spec.block // 2 if spec.format == "int4" else spec.block
    return QuantizedArray(
        jnp.zeros((blocks, width), jnp.uint8),
        jnp.zeros((blocks,), jnp.float32),
        tuple(shape),
        spec.format,
        signed,
    )


def _split_axes(x: Array) -> Any:
    """For `x` sharded over `Explicit` mesh axes (sharding in types), the mesh axes
    splitting its first dimension (`()` if none); `None` for an `x` not sharded in
    its type (its reshapes need no sharding)."""
    sharding = explicit_sharding(x)
    if sharding is None:
        return None
    first = sharding.spec[0] if len(sharding.spec) else None
    return () if first is None else first


def _reshape(x: Array, shape: tuple[int, ...], spec: PartitionSpec | None) -> Array:
    """`x.reshape(shape)`, with sharding in types split as `spec` (on the first
    dimension) or replicated (`spec=None`)."""
    if _split_axes(x) is None:
        return x.reshape(shape)
    known = math.prod(n for n in shape if n != -1)
    shape = tuple(x.size // known if n == -1 else n for n in shape)
    if spec is None:
        return jax.sharding.reshard(x, PartitionSpec()).reshape(shape)
    return lax.reshape(x, shape, out_sharding=spec)


def _flatten(x: Array, block: int) -> Array:
    """`x` as one dimension; with sharding in types, split (as `block_sharding`
    splits the blocks) when each shard of `x`'s rows holds whole blocks."""
    split = _split_axes(x)
    if split is None:
        return x.reshape(-1)
    sharding = jax.typeof(x).sharding
    placed = block_sharding(sharding, tuple(x.shape), block)
    return _reshape(x, (-1,), PartitionSpec(split) if placed.spec else None)


def block_sharding(
    sharding: NamedSharding, shape: tuple[int, ...], block: int
) -> NamedSharding:
    """The sharding of a quantized buffer's codes and scales (both split along their
    leading, per-block axis) for a param of `shape` sharded as `sharding`: split over
    the mesh axes that split the param's first dimension when that is the param's only
    sharded dimension and each shard holds whole blocks (the blocks follow the param's
    row-major order, so each device then holds the blocks of its own rows);
    replicated otherwise."""
    spec = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
    mesh = sharding.mesh
    if not shape or any(entry not in (None, ()) for entry in spec[1:]):
        return NamedSharding(mesh, PartitionSpec(), memory_kind=sharding.memory_kind)
    first = spec[0]
    axes = (first,) if isinstance(first, str) else tuple(first or ())
    n = math.prod(mesh.shape[a] for a in axes)
    size = math.prod(shape)
    if not axes or shape[0] % n or (size // n) % block:
        return NamedSharding(mesh, PartitionSpec(), memory_kind=sharding.memory_kind)
    return NamedSharding(mesh, PartitionSpec(first), memory_kind=sharding.memory_kind)


# --- the storage rule of a buffer ---------------------------------------------------


def storage_of(state_dtype: Any, name: str) -> Any:
    """What `state_dtype` says for the buffer `name`: a dtype, `None` (the param's
    dtype) or a `Quantized`."""
    if isinstance(state_dtype, Mapping):
        return state_dtype.get(name)
    return state_dtype


def new_buffer(p: Array, value: Any, storage: Any, nonnegative: bool) -> Any:
    """The initial buffer mirroring the param leaf `p`, filled with `value`: an array
    in `storage`'s dtype (default `p`'s), or a `QuantizedArray`."""
    if isinstance(storage, Quantized):
        if p.size < storage.min_size or jnp.iscomplexobj(p):
            return full_like_leaf(p, value, p.dtype)
        out = empty(tuple(p.shape), storage, signed=not nonnegative)
        if not (isinstance(value, (int, float)) and value == 0):
            out = encode(jnp.full(p.shape, value, jnp.float32), out)
        sharding = getattr(p, "sharding", None)
        if isinstance(sharding, NamedSharding) and not isinstance(p, jax.core.Tracer):
            # Eagerly, on the param's mesh (under `jit`, `eqxopt.state_shardings`
            # gives the same placement as `out_shardings`).
            placed = block_sharding(sharding, tuple(p.shape), storage.block)
            out = eqx.tree_at(
                lambda q: (q.codes, q.scales),
                out,
                jax.device_put((out.codes, out.scales), placed),
            )
        return out
    return full_like_leaf(p, value, storage or p.dtype)


def buffers_like(
    params, state_dtype: Any, name: str, nonnegative: bool, value: Any = 0
):
    """[`new_buffer`][] at every optimised leaf of `params`; `None` elsewhere."""
    storage = storage_of(state_dtype, name)
    return tree_map(lambda p: new_buffer(p, value, storage, nonnegative), params)


def dtype_of(buffer) -> Any:
    """The dtype a buffer's values are read in (float32 for a quantized one)."""
    if isinstance(buffer, QuantizedArray):
        return np.dtype(jnp.float32)
    return buffer.dtype


def read(buffer, dtype=None) -> Array:
    """A buffer's values (a quantized one decoded), cast to `dtype` if given."""
    x = buffer.decode() if isinstance(buffer, QuantizedArray) else buffer
    return x if dtype is None else x.astype(dtype)


def write(new: Array, old):
    """`new` stored as `old` is: re-encoded like a `QuantizedArray`, else cast to
    `old`'s dtype."""
    if isinstance(old, QuantizedArray):
        return encode(new, old)
    return new.astype(old.dtype)


def is_quantized(buffer) -> bool:
    return isinstance(buffer, QuantizedArray)


# --- checking `state_dtype` at construction ------------------------------------------


def _is_dtype(value) -> bool:
    try:
        jnp.dtype(value)
    except TypeError:
        return False
    return True


def check_storage(opt, field: str, buffers: Mapping[str, bool] | None) -> None:
    """Check a `state_dtype`-like field of `opt` against the buffers it declares
    (`{name: non-negative}`; `None`: the optimizer takes dtypes only). Raises a
    `ValueError` naming the field."""
    value = getattr(opt, field, None)
    name = type(opt).__name__
    if value is None or not isinstance(value, (Quantized, Mapping)):
        return
    if isinstance(value, Mapping):
        if not buffers:
            _no_buffers(name, field, buffers)
        unknown = [k for k in value if k not in buffers]
        if unknown:
            raise ValueError(
                f"`{name}({field}=...)`: unknown buffer name(s) "
                f"{', '.join(map(repr, unknown))}; the buffers of `{name}` are "
                f"{', '.join(map(repr, buffers or {}))}."
            )
        for key, entry in value.items():
            if entry is not None and not isinstance(entry, Quantized):
                if not _is_dtype(entry):
                    raise ValueError(
                        f"`{name}({field}=...)`: the entry for {key!r} must be a "
                        f"dtype, `eqxopt.Quantized(...)` or None, got {entry!r}."
                    )
        return
    if not buffers:
        _no_buffers(name, field, buffers)


def _no_buffers(name: str, field: str, buffers) -> None:
    why = (
        "has no state buffer that mirrors a param"
        if buffers is not None
        else "does not support quantized or per-buffer state yet"
    )
    raise ValueError(
        f"`{name}({field}=...)`: `{name}` {why}, so `{field}` must be a dtype or "
        "None, not an `eqxopt.Quantized` or a dict."
    )


def plain_dtype(state_dtype: Any) -> Any:
    """The dtype that `state_dtype` gives the state that mirrors no param (row
    statistics, scalars, coefficients): itself if a dtype or `None`, `None` (the
    param's dtype) if a `Quantized` or a per-buffer dict."""
    if isinstance(state_dtype, (Quantized, Mapping)):
        return None
    return state_dtype


def copy_like(params, state_dtype: Any, name: str, nonnegative: bool = False):
    """The buffer `name` starting at the params' values (an average, an iterate):
    at every optimised leaf a copy in the dtype `state_dtype` gives it (a copy, not
    the params' own array, so that params and state can both be donated to a jit),
    or the values encoded in a `QuantizedArray`; `None` elsewhere."""
    storage = storage_of(state_dtype, name)

    def _leaf(p):
        if isinstance(storage, Quantized):
            return new_buffer(p, p, storage, nonnegative)
        return jnp.array(p, dtype=storage or p.dtype, copy=True)

    return tree_map(_leaf, params)
