"""Typed PRNG keys in optimizer state: a key is stored as its raw data plus its
implementation's name, so the state stays a plain array carry (`AddNoise`,
`NoisySGD`, `DPSGD`, `Sophia`, `Kron`)."""

import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
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
