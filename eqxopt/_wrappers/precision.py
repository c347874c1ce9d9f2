r"""Low-precision params that lose nothing: `StochasticRounding` and `Compensated`
(docs/memory_precision.md)."""

from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, Inexact, Int32, Key, PyTree

from .._checks import need_params
from .._core.base import AbstractOptimizer, child_update
from .._custom_types import Params, Updates
from .._misc import (
    is_none,
    is_param,
    pack,
    tree_map,
    tree_map_unzip,
    typechecked,
)
from .._random import check_key, pack_key, unpack_key


def _low_precision(dtype) -> bool:
    """Whether a param dtype is rounded by these wrappers (bfloat16, float16)."""
    return np.dtype(dtype) in (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))


def _check_optimizer(opt) -> None:
    if not isinstance(opt.optimizer, AbstractOptimizer):
        raise ValueError(
            f"`{type(opt).__name__}(optimizer=...)` must be an eqxopt optimizer, got "
            f"{type(opt.optimizer).__name__}."
        )


def stochastic_round(x: Array, dtype, key: Array) -> Array:
    """`x` (float32) rounded to `dtype` (bfloat16 or float16) stochastically: to each
    of its two neighbours with probability proportional to proximity, so the result
    is `x` in expectation. bfloat16 uses torchao's `_fp32_to_bf16_sr` (16 random bits
    against the 16 bits that rounding towards zero drops)."""
    if np.dtype(dtype) == np.dtype(jnp.bfloat16):
        bits = lax.bitcast_convert_type(x, jnp.uint32)
        rand = jr.bits(key, x.shape, jnp.uint32) >> 16
        towards_zero = bits & jnp.uint32(0xFFFF0000)
        away = towards_zero + jnp.uint32(0x10000)
        out = jnp.where(rand < (bits & jnp.uint32(0xFFFF)), away, towards_zero)
        rounded = lax.bitcast_convert_type(out, jnp.float32).astype(jnp.bfloat16)
        return jnp.where(jnp.isfinite(x), rounded, x.astype(jnp.bfloat16))
    nearest = x.astype(dtype)
    near32 = nearest.astype(jnp.float32)
    other = jnp.where(
        near32 > x,
        jnp.nextafter(nearest, jnp.asarray(-jnp.inf, dtype)),
        jnp.nextafter(nearest, jnp.asarray(jnp.inf, dtype)),
    )
    gap = jnp.abs(other.astype(jnp.float32) - near32)
    prob = jnp.where(gap > 0, jnp.abs(x - near32) / jnp.where(gap > 0, gap, 1), 0)
    u = jr.uniform(key, x.shape, jnp.float32)
    out = jnp.where(u < prob, other, nearest)
    return jnp.where(jnp.isfinite(x) & jnp.isfinite(other), out, nearest)


@typechecked
class StochasticRoundingState(eqx.Module):
    """State of [`eqxopt.StochasticRounding`][]: the inner optimizer's state and the
    PRNG key of the next rounding, stored as `int32` key data with its
    implementation's name (so that it serialises); `state.key` is the typed key.

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones(4, jnp.bfloat16)}
        opt = eqxopt.StochasticRounding(eqxopt.SGD(0.1), key=0)
        state = opt.init(params)
        assert jnp.issubdtype(state.key.dtype, jax.dtypes.prng_key)
        ```
    """

    inner_state: Any
    key_data: Int32[Array, "..."]
    impl: str = eqx.field(static=True)

    @property
    def key(self) -> Key[Array, ""]:
        """The PRNG key, as a typed key array (`jax.random.key`)."""
        return unpack_key(self.key_data, self.impl)


class StochasticRounding(AbstractOptimizer[StochasticRoundingState]):
    r"""Stochastic rounding of low-precision params: `step` writes each bfloat16 or
    float16 param as $\mathrm{SR}(p + u)$, with $p + u$ computed in float32 ($u$ the
    inner update) and rounded to one of its two neighbouring representable values
    with probability proportional to proximity, so that small updates are kept in
    expectation instead of being rounded away. For bfloat16 this is torchao's
    `bf16_stochastic_round`. float32 and float64 params are written exactly as without
    the wrapper. `update` returns $\mathrm{SR}(p + u) - p$ in the param's dtype.

    $u$ is the inner optimizer's update in the param's dtype (dtype rule 4): its own
    rounding is relative ($2^{-9}$ in bfloat16); the rounding of $p + u$, which loses
    every update smaller than half a unit of $p$, is the one made stochastic.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((4, 4), jnp.bfloat16)}
        grads = {"w": jnp.full((4, 4), 1e-3, jnp.float32)}
        opt = eqxopt.StochasticRounding(eqxopt.SGD(1e-2), key=0)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert params["w"].dtype == jnp.bfloat16
        ```
    """

    optimizer: AbstractOptimizer
    key: Any = 0

    def __check_init__(self):
        _check_optimizer(self)
        check_key(self)

    def init(self, params: Params) -> StochasticRoundingState:
        key = self.key
        if isinstance(key, (int, np.integer)):
            key = jr.key(int(key))
        elif not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jr.wrap_key_data(jnp.asarray(key, jnp.uint32))
        return StochasticRoundingState(self.optimizer.init(params), *pack_key(key))

    def _rounded(self, grads, state, params, extra):
        """`(new params (rounded where low precision), inner state, next key)`."""
        need_params(self, params)
        updates, inner = child_update(
            self.optimizer, ".inner_state", grads, state.inner_state, params, **extra
        )
        leaves = [
            p
            for p, u in zip(
                jtu.tree_leaves(params, is_leaf=is_none),
                jtu.tree_leaves(updates, is_leaf=is_none),
            )
            if is_param(p) and u is not None and _low_precision(p.dtype)
        ]
        key, sub = jr.split(state.key)
        draws = iter(list(jr.split(sub, len(leaves))) if leaves else [])

        def _leaf(u, p):
            if not _low_precision(p.dtype):
                return pack(p + u, u)
            new = stochastic_round(
                p.astype(jnp.float32) + u.astype(jnp.float32), p.dtype, next(draws)
            )
            diff = (new.astype(jnp.float32) - p.astype(jnp.float32)).astype(p.dtype)
            return pack(new, diff)

        new_params, diffs = tree_map_unzip(
            _leaf, 2, updates, params, names=("updates", "params")
        )
        return new_params, diffs, inner, key

    def update(self, grads: Updates, state, params=None, **extra):
        _, diffs, inner, key = self._rounded(grads, state, params, extra)
        return diffs, StochasticRoundingState(inner, *pack_key(key))

    def step(self, model: Params, grads: Updates, state, **extra):
        new, _, inner, key = self._rounded(grads, state, model, extra)
        model = eqx.combine(new, model, is_leaf=is_none)
        return model, StochasticRoundingState(inner, *pack_key(key))

    def hyperparams(self, state) -> dict[str, Any]:
        return {"optimizer": self.optimizer.hyperparams(state.inner_state)}


StochasticRounding.__init__.__doc__ = """**Arguments:**

- `optimizer`: the optimizer whose updates are applied (e.g. `eqxopt.AdamW(1e-3)`).
- `key`: an int seed or a `jax.random.key`; default `0`.
"""


@typechecked
class CompensatedState(eqx.Module):
    """State of [`eqxopt.Compensated`][]: the inner optimizer's state and, per
    low-precision param, the rounding error of its last write (`None` at the other
    leaves).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"h": jnp.ones(4, jnp.bfloat16), "f": jnp.ones(4, jnp.float32)}
        opt = eqxopt.Compensated(eqxopt.SGD(0.1))
        state = opt.init(params)
        assert state.compensation["h"].dtype == jnp.bfloat16
        assert state.compensation["f"] is None  # float32: nothing to compensate
        ```
    """

    inner_state: Any
    compensation: PyTree[Inexact[Array, "..."]]


class Compensated(AbstractOptimizer[CompensatedState]):
    r"""Kahan-compensated low-precision params (as optimi's `kahan_sum` and
    heavyball's `param_ecc`): per bfloat16 or float16 param, the state keeps the
    rounding error $c$ of its last write and adds it back before the next one,

    $$y = u + c, \qquad p' = \mathrm{round}(p + y), \qquad c' = (p + y) - p',$$

    computed in float32, so the params follow the float32 trajectory to within the
    compensation's precision. float32 and float64 params are updated as without the
    wrapper (and have no compensation buffer).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((4, 4), jnp.bfloat16)}
        grads = {"w": jnp.full((4, 4), 1e-3, jnp.float32)}
        opt = eqxopt.Compensated(eqxopt.SGD(1e-2))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert state.compensation["w"].dtype == jnp.bfloat16
        ```
    """

    optimizer: AbstractOptimizer
    state_dtype: DTypeLike | None = eqx.field(default=None, static=True)

    def __check_init__(self):
        _check_optimizer(self)

    def init(self, params: Params) -> CompensatedState:
        def _leaf(p):
            if not _low_precision(p.dtype):
                return None
            return jnp.zeros_like(p, dtype=self.state_dtype or p.dtype)

        return CompensatedState(self.optimizer.init(params), tree_map(_leaf, params))

    def _apply(self, grads, state: CompensatedState, params, extra):
        """`(new params, their difference to params, compensation, inner state)`."""
        need_params(self, params)
        updates, inner = child_update(
            self.optimizer, ".inner_state", grads, state.inner_state, params, **extra
        )

        def _leaf(u, p, c):
            if c is None:
                return pack(p + u, u, None)
            p32 = p.astype(jnp.float32)
            target = p32 + (u.astype(jnp.float32) + c.astype(jnp.float32))
            new = target.astype(p.dtype)
            error = (target - new.astype(jnp.float32)).astype(c.dtype)
            diff = (new.astype(jnp.float32) - p32).astype(p.dtype)
            return pack(new, diff, error)

        new, diffs, comp = tree_map_unzip(
            _leaf,
            3,
            updates,
            params,
            state.compensation,
            names=("updates", "params", "state.compensation"),
        )
        return new, diffs, comp, inner

    def update(self, grads: Updates, state: CompensatedState, params=None, **extra):
        _, diffs, comp, inner = self._apply(grads, state, params, extra)
        return diffs, CompensatedState(inner, comp)

    def step(self, model: Params, grads: Updates, state: CompensatedState, **extra):
        new, _, comp, inner = self._apply(grads, state, model, extra)
        model = eqx.combine(new, model, is_leaf=is_none)
        return model, CompensatedState(inner, comp)

    def hyperparams(self, state: CompensatedState) -> dict[str, Any]:
        return {"optimizer": self.optimizer.hyperparams(state.inner_state)}


Compensated.__init__.__doc__ = """**Arguments:**

- `optimizer`: the optimizer whose updates are applied (e.g. `eqxopt.AdamW(1e-3)`).
- `state_dtype`: dtype of the compensation buffers; default the param's. (Static.)
"""
