from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer, CountState
from .._custom_types import FilterSpec, Params, ScalarOrSchedule, Updates
from .._filter_spec import decay_mask
from .._misc import (
    compute_dtype,
    increment,
    mask_field,
    out_dtype,
    per_dtype,
    resolve,
    scalar,
    tree_map,
    zero_count,
)


class AddDecayedWeights(AbstractOptimizer[CountState]):
    r"""Add decayed weights: $u \mapsto u + \lambda_k\,p$ on the leaves `mask` selects.

    `mask` is a filter spec (as for `eqx.partition`): a PyTree prefix of the params with
    bools, or a per-leaf callable. `weight_decay` may be a schedule. Needs `params`.
    Matches `optax.add_decayed_weights`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByAdam(),
            eqxopt.AddDecayedWeights(1e-2, mask=lambda p: p.ndim > 1),
            eqxopt.ScaleByLearningRate(1e-3),
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # AdamW: the decay is added before the learning rate
        ```
    """

    weight_decay: ScalarOrSchedule = 0.0
    mask: FilterSpec | None = mask_field(default=None)

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("weight_decay",))

    def init(self, params: Params) -> CountState:
        return CountState(zero_count())

    def update(self, grads: Updates, state: CountState, params=None, **extra):
        need_params(self, params)
        wd = resolve(self.weight_decay, state.count)
        mask = decay_mask(self.mask, params)
        decay = per_dtype(lambda dtype: scalar(wd, dtype))

        def _leaf(g, p, m):
            if m is False:
                return g
            dtype = compute_dtype(g.dtype, p.dtype)
            decayed = g.astype(dtype) + decay(dtype) * p.astype(dtype)
            return decayed.astype(out_dtype(g, p))

        updates = tree_map(
            _leaf, grads, params, mask, names=("grads", "params", "mask")
        )
        return updates, CountState(increment(state.count))
