from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer, CountState, EmptyState
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    compute_dtype,
    increment,
    out_dtype,
    per_dtype,
    resolve,
    scalar,
    tree_map,
    zero_count,
)


class Scale(AbstractOptimizer[EmptyState]):
    r"""Multiply updates by a constant: $u \mapsto s\,u$. Matches `optax.scale`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.ScaleByAdam(), eqxopt.Scale(-1e-3))  # Adam, by hand
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    step_size: ScalarLike

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        step_size = per_dtype(lambda dtype: scalar(self.step_size, dtype))

        def _leaf(g, p):
            dtype = compute_dtype(g.dtype)
            return (g.astype(dtype) * step_size(dtype)).astype(out_dtype(g, p))

        return tree_map(_leaf, grads, params, names=("grads", "params")), state


class ScaleByLearningRate(AbstractOptimizer[CountState]):
    r"""Multiply updates by $-\eta_k$ (or $\eta_k$ with `flip_sign=False`).

    $\eta$ may be a number, an array, or a schedule evaluated at the number of updates
    already applied. Matches `optax.scale_by_learning_rate`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.ScaleByLearningRate(0.1)  # plain gradient descent: u = -0.1 g
        updates, state = opt.update(grads, opt.init(params))
        assert jnp.allclose(updates["w"], -0.1 * grads["w"])
        ```
    """

    learning_rate: ScalarOrSchedule
    flip_sign: bool = True

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("learning_rate",))

    def init(self, params: Params) -> CountState:
        return CountState(zero_count())

    def update(self, grads: Updates, state: CountState, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)
        sign = -1 if self.flip_sign else 1
        factor = per_dtype(lambda dtype: sign * scalar(lr, dtype))

        def _leaf(g, p):
            dtype = compute_dtype(g.dtype)
            return (g.astype(dtype) * factor(dtype)).astype(out_dtype(g, p))

        updates = tree_map(_leaf, grads, params, names=("grads", "params"))
        return updates, CountState(increment(state.count))
