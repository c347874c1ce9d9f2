import equinox as eqx
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._kernels import momentum_step
from .._misc import (
    compute_dtype,
    increment,
    out_dtype,
    pack,
    per_dtype,
    resolve,
    scalar,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, Stored


@typechecked
class SGDState(eqx.Module):
    """State of [`eqxopt.SGD`][]: the step count and the momentum buffer (`None`
    without momentum).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.SGD(0.1, momentum=0.9).init(params)
        assert state.count == 0 and state.trace["w"].shape == (2, 3)
        assert eqxopt.SGD(0.1).init(params).trace is None  # no momentum, no buffer
        ```
    """

    count: Int32[Array, ""]
    trace: PyTree[Stored] | None


class SGD(AbstractOptimizer[SGDState]):
    r"""Stochastic gradient descent, with optional (Nesterov) momentum.

    $$t_k = g_k + \mu\,t_{k-1}, \qquad u_k = -\eta_k\,t_k
    \quad(\text{Nesterov: } u_k = -\eta_k\,(g_k + \mu\,t_k))$$

    Matches `optax.sgd` (`accumulator_dtype` is called `state_dtype` here).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.SGD(0.1, momentum=0.9, nesterov=True)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    momentum: ScalarLike | None = None
    nesterov: bool = eqx.field(default=False, static=True)
    state_dtype: object = eqx.field(default=None, static=True)

    def _param_buffers(self) -> dict[str, bool]:
        return {} if self.momentum is None else {"trace": False}

    def __check_init__(self):
        check_hyperparams(
            self, nonnegative=("learning_rate",), unit_interval=("momentum",)
        )

    def init(self, params: Params) -> SGDState:
        trace = None
        if self.momentum is not None:
            trace = buffers_like(params, self.state_dtype, "trace", False)
        return SGDState(zero_count(), trace)

    def update(self, grads: Updates, state: SGDState, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)
        # Cast once per update and dtype, not once per leaf.
        neg_lr = per_dtype(lambda dtype: -scalar(lr, dtype))
        beta = self.momentum
        decay = per_dtype(lambda dtype: None if beta is None else scalar(beta, dtype))

        def _leaf(g, t, p):
            momentum = None
            if t is not None:
                momentum = decay(compute_dtype(g.dtype, dtype_of(t)))
            direction, t = momentum_step(g, t, momentum, self.nesterov)
            update = direction * neg_lr(direction.dtype)
            return pack(update.astype(out_dtype(g, p)), t)

        updates, trace = tree_map_unzip(
            _leaf,
            2,
            grads,
            state.trace,
            params,
            names=("grads", "state.trace", "params"),
        )
        trace = None if self.momentum is None else trace
        return updates, SGDState(increment(state.count), trace)


SGD.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`.
- `momentum`: $\mu$ in `[0, 1)`, or `None` (default) for plain SGD.
- `nesterov`: use Nesterov momentum. (Static.)
- `state_dtype`: dtype of the momentum buffer; default the param's. (Static.)
"""
