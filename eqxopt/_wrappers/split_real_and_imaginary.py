"""SplitRealAndImaginary: run a real-valued optimizer on complex params."""

from typing import Any, Generic

import equinox as eqx
import jax.lax as lax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array

from .._core.base import (
    AbstractOptimizer,
    check_optimizer,
    child_update,
    scalar_hyperparams,
)
from .._custom_types import Params, State, Updates
from .._misc import typechecked


class _RealImaginary(eqx.Module):
    """A complex leaf as a pair of real arrays: a PyTree node with two leaves, so the
    inner optimizer's state holds a `.real` and an `.imaginary` buffer for it."""

    real: Array
    imaginary: Array


def _is_pair(x) -> bool:
    return x is None or isinstance(x, _RealImaginary)


def _split(tree):
    def _leaf(x):
        if isinstance(x, jnp.ndarray) and jnp.iscomplexobj(x):
            return _RealImaginary(jnp.real(x), jnp.imag(x))
        return x

    return None if tree is None else jtu.tree_map(_leaf, tree)


def _merge(updates, like):
    """Complex updates from the inner optimizer's pairs, in the dtype of the
    corresponding leaf of `like` (the params, else the grads)."""

    def _leaf(u, x):
        if isinstance(u, _RealImaginary):
            return lax.complex(u.real, u.imaginary.astype(u.real.dtype)).astype(x.dtype)
        return u

    return jtu.tree_map(_leaf, updates, like, is_leaf=_is_pair)


@typechecked
class SplitRealAndImaginaryState(eqx.Module, Generic[State]):
    """State of [`eqxopt.SplitRealAndImaginary`][]: the inner optimizer's state, built
    on the params with every complex leaf split into a `.real` and an `.imaginary`
    part.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"z": jnp.array([1 + 2j, 3 - 1j], jnp.complex64), "b": jnp.zeros(2)}
        opt = eqxopt.SplitRealAndImaginary(eqxopt.Adam(1e-2))
        state = opt.init(params)
        state.inner_state.mu["z"].real, state.inner_state.mu["z"].imaginary  # float32
        assert state.inner_state.mu["z"].real.dtype == jnp.float32
        ```
    """

    inner_state: State


class SplitRealAndImaginary(AbstractOptimizer[SplitRealAndImaginaryState]):
    r"""Run a real-valued optimizer on complex params: every complex leaf
    $z = x + iy$ of the params and grads is split into its real and imaginary parts
    $(x, y)$ before `inner` sees them, and `inner`'s updates $(u_x, u_y)$ are merged
    back into $u_x + i\,u_y$ (in the param's complex dtype). Real leaves pass through
    unchanged. So `inner` treats each complex number as two real ones (e.g. Adam's
    second moment is kept per part, not on $|g|^2$).

    JAX's gradient of a real loss with respect to a complex parameter is the
    *conjugate* of the steepest-ascent direction: pass `jnp.conj(grad)` (see
    [optax#196](https://github.com/google-deepmind/optax/issues/196)). Extra `update`
    arguments are passed on to `inner`. Matches
    `optax.contrib.split_real_and_imaginary`.

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt

        params = {"z": jnp.array([1 + 2j, 3 - 1j], jnp.complex64)}
        loss = lambda p: jnp.sum(jnp.abs(p["z"] - (2 + 1j)) ** 2)
        opt = eqxopt.SplitRealAndImaginary(eqxopt.Adam(0.1))
        state = opt.init(params)
        for _ in range(100):
            grads = jax.tree.map(jnp.conj, jax.grad(loss)(params))
            params, state = opt.step(params, grads, state)
        assert loss(params) < 1e-2
        ```
    """

    inner: AbstractOptimizer

    def __check_init__(self):
        check_optimizer("SplitRealAndImaginary", "inner", self.inner)

    def init(self, params: Params) -> SplitRealAndImaginaryState:
        return SplitRealAndImaginaryState(self.inner.init(_split(params)))

    def update(
        self,
        grads: Updates,
        state: SplitRealAndImaginaryState,
        params=None,
        **extra,
    ):
        updates, inner_state = child_update(
            self.inner,
            ".inner_state",
            _split(grads),
            state.inner_state,
            _split(params),
            **extra,
        )
        return _merge(updates, grads if params is None else params), (
            SplitRealAndImaginaryState(inner_state)
        )

    def hyperparams(self, state: SplitRealAndImaginaryState) -> dict[str, Any]:
        hp = scalar_hyperparams(self, None)
        hp["inner"] = self.inner.hyperparams(state.inner_state)
        return hp


SplitRealAndImaginary.__init__.__doc__ = r"""**Arguments:**

- `inner`: the optimizer run on the real and imaginary parts.
"""
