import equinox as eqx
from jaxtyping import PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, Updates
from .._kernels import momentum_step
from .._misc import (
    compute_dtype,
    out_dtype,
    pack,
    per_dtype,
    scalar,
    tree_map_unzip,
    typechecked,
)
from .._quantized import buffers_like, dtype_of, Stored


@typechecked
class TraceState(eqx.Module):
    """State of [`eqxopt.Trace`][]: the momentum buffer, one leaf per param.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Trace(decay=0.9)
        state = opt.init(params)
        updates, state = opt.update(grads, state)
        assert jnp.all(state.trace["w"] == grads["w"])  # t_1 = g_1
        ```
    """

    trace: PyTree[Stored]


class Trace(AbstractOptimizer[TraceState]):
    r"""Momentum: $t_k = g_k + \mu\,t_{k-1}$; the update is $t_k$, or with Nesterov
    $g_k + \mu\,t_k$. Matches `optax.trace`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.Trace(decay=0.9, nesterov=True), eqxopt.ScaleByLearningRate(0.1)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # = eqxopt.SGD(0.1, momentum=0.9, nesterov=True)
        ```
    """

    decay: ScalarLike
    nesterov: bool = eqx.field(default=False, static=True)
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = {"trace": False}

    def __check_init__(self):
        check_hyperparams(self, unit_interval=("decay",))

    def init(self, params: Params) -> TraceState:
        return TraceState(buffers_like(params, self.state_dtype, "trace", False))

    def update(self, grads: Updates, state: TraceState, params=None, **extra):
        decay = per_dtype(lambda dtype: scalar(self.decay, dtype))

        def _leaf(g, t, p):
            d = decay(compute_dtype(g.dtype, dtype_of(t)))
            direction, t = momentum_step(g, t, d, self.nesterov)
            return pack(direction.astype(out_dtype(g, p)), t)

        updates, trace = tree_map_unzip(
            _leaf,
            2,
            grads,
            state.trace,
            params,
            names=("grads", "state.trace", "params"),
        )
        return updates, TraceState(trace)
