"""`ZeroNans`: replace NaN gradient entries by zero and record that it happened."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, PyTree

from .._core.base import (
    AbstractOptimizer,
)
from .._custom_types import Params, Updates
from .._misc import (
    out_dtype,
    tree_map,
    typechecked,
)


@typechecked
class ZeroNansState(eqx.Module):
    """State of [`eqxopt.ZeroNans`][]: one bool per param leaf, `True` if the grads of
    that leaf contained a NaN at the last update.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.ZeroNans()
        bad = {"w": grads["w"].at[0, 0].set(jnp.nan), "b": grads["b"]}
        updates, state = opt.update(bad, opt.init(params))
        assert state.found_nan["w"] and not state.found_nan["b"]
        ```
    """

    found_nan: PyTree[Bool[Array, ""]]


class ZeroNans(AbstractOptimizer[ZeroNansState]):
    r"""Replace every NaN in the incoming updates by zero:
    $u \mapsto \mathbb{1}[\lnot\mathrm{isnan}(u)]\, u$.

    The state records, per leaf, whether a NaN was seen at the last update (a `bool`,
    always: the flags never turn into numbers, whatever wraps this transform).
    Matches `optax.zero_nans`.

    Inside [`eqxopt.MultiSteps`][] it sees the *mean* of a window's gradients, so a
    NaN in any micro-batch zeroes that entry for the whole window; put it outside
    (`Chain(ZeroNans(), MultiSteps(...))`) to drop single micro-batch entries instead.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.ZeroNans(), eqxopt.Adam(1e-3))
        state = opt.init(params)
        bad = {"w": grads["w"].at[0, 0].set(jnp.nan), "b": grads["b"]}
        params, state = opt.step(params, bad, state)  # the NaN counts as a zero grad
        assert state[0].found_nan["w"] and not jnp.isnan(params["w"]).any()
        ```
    """

    def init(self, params: Params) -> ZeroNansState:
        return ZeroNansState(tree_map(lambda p: jnp.zeros((), jnp.bool_), params))

    def update(self, grads: Updates, state: ZeroNansState, params=None, **extra):
        found_nan = tree_map(lambda g: jnp.any(jnp.isnan(g)), grads)

        def _leaf(g, p):
            return jnp.where(jnp.isnan(g), jnp.zeros_like(g), g).astype(out_dtype(g, p))

        updates = tree_map(_leaf, grads, params, names=("grads", "params"))
        return updates, ZeroNansState(found_nan)


ZeroNans.__init__.__doc__ = """**Arguments:** none."""
