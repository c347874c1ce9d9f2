from typing import Any

from .._core.base import AbstractOptimizer, child_update
from .._custom_types import Params, Updates


class Chain(AbstractOptimizer[tuple]):
    """Apply optimizers in sequence, each to the updates of the one before.

    The state is a tuple of the children's states, so drift inside the second child is
    reported at a path such as `[1].mu['w']`. `hyperparams` are keyed by child index.
    Matches `optax.chain`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.Adam(1e-3))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert isinstance(state[1], eqxopt.AdamState)  # a state per link
        ```
    """

    optimizers: tuple[AbstractOptimizer, ...]

    def __init__(self, *optimizers: AbstractOptimizer):
        for i, opt in enumerate(optimizers):
            if not isinstance(opt, AbstractOptimizer):
                raise ValueError(
                    f"`Chain(...)` takes eqxopt optimizers, but argument {i} is "
                    f"{type(opt).__name__}. Wrap Optax transforms with "
                    "`eqxopt.from_optax`."
                )
        self.optimizers = tuple(optimizers)

    def init(self, params: Params) -> tuple:
        return tuple(opt.init(params) for opt in self.optimizers)

    def update(
        self, grads: Updates, state: tuple, params: Params | None = None, **extra
    ):
        if not isinstance(state, tuple) or len(state) != len(self.optimizers):
            raise ValueError(
                f"`Chain` of {len(self.optimizers)} optimizers was given a state that "
                "is not a tuple of as many states; pass the state its `init` returned."
            )
        new_state = []
        for i, (opt, sub_state) in enumerate(zip(self.optimizers, state)):
            grads, sub_state = child_update(
                opt, f"[{i}]", grads, sub_state, params, **extra
            )
            new_state.append(sub_state)
        return grads, tuple(new_state)

    def hyperparams(self, state: tuple) -> dict[Any, Any]:
        return {
            i: opt.hyperparams(sub_state)
            for i, (opt, sub_state) in enumerate(zip(self.optimizers, state))
        }


Chain.__init__.__doc__ = """**Arguments:**

- `*optimizers`: the optimizers to apply, first to last.
"""
