"""Typed PRNG keys in optimizer state: a key is stored as its raw data plus its
implementation's name, so the state stays a plain array carry (`AddNoise`,
`NoisySGD`, `DPSGD`, `Sophia`, `Kron`); and [`chunked_draws`][], the draws of many
leaves from one copy of the sampler."""

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jax.extend.random import define_prng_impl, threefry2x32_p
from jaxtyping import Array


def pack_key(key) -> tuple[Array, str]:
    return lax.bitcast_convert_type(jr.key_data(key), jnp.int32), str(jr.key_impl(key))


def unpack_key(data: Array, impl: str) -> Array:
    return jr.wrap_key_data(lax.bitcast_convert_type(data, jnp.uint32), impl=impl)


def check_key(opt) -> None:
    key = opt.key
    if key is None or (
        isinstance(key, (int, np.integer)) and not isinstance(key, bool)
    ):
        return
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(
                f"`{type(opt).__name__}(key=...)` must be a single key, got a key "
                f"array of shape {key.shape}."
            )
        return
    if isinstance(key, (jax.Array, np.ndarray)) and key.dtype == np.uint32:
        return  # a legacy raw key (`jax.random.PRNGKey`)
    raise ValueError(
        f"`{type(opt).__name__}(key=...)` must be an int seed or a `jax.random.key`, "
        f"got {key!r}."
    )


# --- one sampler for the draws of many leaves --------------------------------------

# Elements drawn per row of `chunked_draws`: a leaf's draw is padded up to a multiple
# of it (at most 1,023 draws wasted per leaf).
_CHUNK = 1024


def _chunk_bits(data: Array, bit_width: int, shape: tuple[int, ...]) -> Array:
    """The random bits of a chunk key `(k1, k2, start)`: elements `start`,
    `start + 1`, ... of the draw of the threefry key `(k1, k2)`, as JAX's
    partitionable threefry computes them (`jax_threefry_partitionable`, on by
    default): element `e` of any draw is `threefry2x32((k1, k2), (0, e))` (the two
    words xor-ed for 32 bits or fewer, joined for 64), whatever the draw's shape."""
    counts = data[2] + lax.iota(jnp.uint32, math.prod(shape))
    bits1, bits2 = threefry2x32_p.bind(data[0], data[1], jnp.zeros_like(counts), counts)
    if bit_width == 64:
        wide = jnp.uint64
        bits = (bits1.astype(wide) << wide(32)) | bits2.astype(wide)
    else:
        bits = (bits1 ^ bits2).astype(f"uint{bit_width}")
    return bits.reshape(shape)


def _unsupported(*args):
    raise NotImplementedError("chunk keys only draw random bits")


_CHUNK_IMPL = define_prng_impl(
    key_shape=(3,),
    seed=_unsupported,
    split=_unsupported,
    random_bits=_chunk_bits,
    fold_in=_unsupported,
    name="eqxopt_threefry_chunk",
)


def typed_keys(keys: Array) -> bool:
    """Whether `keys` is a typed key array (`jax.random.key`), not raw `uint32` data
    (`jax.random.PRNGKey`, drawn with the default implementation)."""
    return jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)


def threefry_keys(keys: Array) -> bool:
    """Whether `keys` draws with JAX's `threefry2x32` implementation (raw data: the
    default implementation)."""
    typed = keys if typed_keys(keys) else jr.wrap_key_data(keys)
    return str(jr.key_impl(typed)) == "threefry2x32"


def chunked_draws(
    sample: Callable, keys: Array, specs: Sequence[tuple[tuple[int, ...], Any]]
) -> list[Array] | None:
    """`[sample(k, shape, dtype) for k, (shape, dtype) in zip(keys, specs)]`, the same
    numbers, drawn by one `vmap`-ed call of `sample` per dtype over chunks of 1,024
    elements, so the compiled program holds one copy of the sampler (threefry, and
    for a normal draw the inverse error function) whatever the leaves' shapes.
    `sample` must draw each element from its own random bits (`jax.random.normal`,
    `uniform`, `rademacher`, `bernoulli`).

    Each chunk's key holds its leaf's threefry key and where the chunk starts in the
    leaf's draw (see [`_chunk_bits`][]). The chunks of same-shape leaves are
    consecutive, so each shape's draws are one slice of the chunks. `None` where the
    leaves' draws are not threefry's partitionable ones (another key implementation,
    `jax_threefry_partitionable` off, a leaf of 2^32 elements or more, a complex
    dtype, whose draws split their keys): the caller draws them otherwise."""
    partitionable = jax.config.jax_threefry_partitionable  # pyright: ignore
    if (
        not partitionable
        or not threefry_keys(keys)
        or any(math.prod(shape) >= 2**32 for shape, _ in specs)
        or any(jnp.issubdtype(dtype, jnp.complexfloating) for _, dtype in specs)
    ):
        return None
    data = jr.key_data(keys) if typed_keys(keys) else keys
    groups: dict[tuple, list[int]] = {}
    for j, (shape, dtype) in enumerate(specs):
        groups.setdefault((tuple(shape), jnp.dtype(dtype)), []).append(j)
    draws: list[Any] = [None] * len(specs)
    for dtype in dict.fromkeys(d for _, d in groups):  # in order of appearance
        # Rows: per shape, its leaves' chunks in order.
        leaf, start, blocks, row = [], [], [], 0
        for (shape, d), members in groups.items():
            if d != dtype:
                continue
            rows = -(-math.prod(shape) // _CHUNK)
            for j in members:
                leaf += [j] * rows
                start += range(0, rows * _CHUNK, _CHUNK)
            blocks.append((shape, members, row, rows))
            row += rows * len(members)
        chunk_keys = jr.wrap_key_data(
            jnp.concatenate(
                [data[np.asarray(leaf)], jnp.asarray(start, jnp.uint32)[:, None]], 1
            ),
            impl=_CHUNK_IMPL,
        )
        rows_drawn = jax.vmap(lambda k: sample(k, (_CHUNK,), dtype))(chunk_keys)
        for shape, members, first, rows in blocks:
            size = math.prod(shape)
            block = rows_drawn[first : first + rows * len(members)]
            block = block.reshape(len(members), rows * _CHUNK)[:, :size]
            block = block.reshape(len(members), *shape)
            for n, j in enumerate(members):
                draws[j] = block[n]
    return draws
