"""Lookahead: k fast steps forward, one slow step back."""

from typing import Any, Generic

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer, child_update, scalar_hyperparams
from .._custom_types import Params, ScalarLike, State, Updates
from .._misc import (
    compute_dtype,
    out_dtype,
    pack,
    scalar,
    sharded_like,
    tree_map,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import copy_like, dtype_of, read, Stored, write


@typechecked
class LookaheadState(eqx.Module, Generic[State]):
    """State of [`eqxopt.Lookahead`][]: the fast optimizer's state, the number of fast
    steps since the last synchronisation, and the slow params, one leaf per param (they
    may be quantized: [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Lookahead(eqxopt.Adam(1e-3), 6, 0.5)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert state.steps_since_sync == 1
        state.slow_params["w"], state.fast_state.mu["w"]
        ```
    """

    fast_state: State
    steps_since_sync: Int32[Array, ""]
    slow_params: PyTree[Stored]


class Lookahead(AbstractOptimizer[LookaheadState]):
    r"""Lookahead: run `fast_optimizer` on the params, and every `sync_period` steps
    pull the slow params towards the fast ones and restart from there.

    On a synchronisation step, with fast params $\phi$ (after the fast update) and
    slow params $\theta$,

    $$\theta \leftarrow \theta + \alpha\,(\phi - \theta), \qquad
      \phi \leftarrow \theta$$

    ($\alpha$ = `slow_step_size`); on the other steps the fast update passes through.

    The eqxopt way: the params you optimise *are* the fast params (compute gradients
    at them and `step` them as usual), and the slow params live in the state. Read
    them with [`eqxopt.Lookahead.eval_params`][] to evaluate or checkpoint; right
    after a synchronisation both coincide. Optax's `lookahead` instead takes and
    returns `LookaheadParams(fast, slow)` pairs; the fast params and the updates here
    equal Optax's `.fast` ones step for step.

    ??? cite "References"

        ```bibtex
        @inproceedings{zhang2019lookahead,
            title={Lookahead Optimizer: k steps forward, 1 step back},
            author={Zhang, Michael R. and Lucas, James and Hinton, Geoffrey and
                Ba, Jimmy},
            booktitle={NeurIPS}, year={2019}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Lookahead(eqxopt.Adam(1e-3), sync_period=6, slow_step_size=0.5)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        eval_params = opt.eval_params(state, params)  # the slow params
        ```
    """

    fast_optimizer: AbstractOptimizer
    sync_period: int = eqx.field(static=True)
    slow_step_size: ScalarLike
    reset_state: bool = eqx.field(default=False, static=True)
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = {"slow_params": False}

    def __check_init__(self):
        if not isinstance(self.fast_optimizer, AbstractOptimizer):
            raise ValueError(
                "`Lookahead(fast_optimizer=...)` must be an eqxopt optimizer, got "
                f"{type(self.fast_optimizer).__name__}."
            )
        check_hyperparams(
            self,
            positive_int=("sync_period",),
            closed_unit_interval=("slow_step_size",),
        )

    def init(self, params: Params) -> LookaheadState:
        slow = copy_like(params, self.state_dtype, "slow_params")
        return LookaheadState(self.fast_optimizer.init(params), zero_count(), slow)

    def update(self, grads: Updates, state: LookaheadState, params=None, **extra):
        need_params(self, params, "the fast params")
        updates, fast_state = child_update(
            self.fast_optimizer, ".fast_state", grads, state.fast_state, params, **extra
        )
        sync = state.steps_since_sync == self.sync_period - 1

        def _leaf(u, p, s):
            dtype = compute_dtype(u.dtype, p.dtype, dtype_of(s))
            u32, s32 = u.astype(dtype), read(s, dtype)
            alpha = scalar(self.slow_step_size, dtype)
            p32 = p.astype(dtype)
            new_s = jnp.where(sync, s32 + alpha * (p32 + u32 - s32), s32)
            # At a sync the new fast params are the new slow params:
            # p + u - (1 - alpha) (p + u - s) = s + alpha (p + u - s). Written from
            # the new slow params, the update reads them and not the old ones, so in
            # a jitted step with the state donated XLA updates the slow params and
            # then the params in place, instead of first copying both.
            new_u = jnp.where(sync, new_s - p32, u32)
            return pack(new_u.astype(out_dtype(u, p)), write(new_s, s))

        updates, slow = tree_map_unzip(
            _leaf,
            2,
            updates,
            params,
            state.slow_params,
            names=("updates", "params", "state.slow_params"),
        )
        if self.reset_state:
            fresh = self.fast_optimizer.init(params)
            fast_state = jtu.tree_map(
                lambda new, init: jnp.where(sync, sharded_like(init, new), new),
                fast_state,
                fresh,
            )
        steps = jnp.where(sync, zero_count(), state.steps_since_sync + 1)
        return updates, LookaheadState(fast_state, steps, slow)

    def eval_params(self, state: LookaheadState, params: Params) -> Params:
        """The slow params, in the params' dtypes (non-array leaves are taken from
        `params`)."""
        slow = tree_map(
            lambda p, s: read(s, p.dtype),
            params,
            state.slow_params,
            names=("params", "state.slow_params"),
        )
        return eqx.combine(slow, params, is_leaf=lambda x: x is None)

    def hyperparams(self, state: LookaheadState) -> dict[str, Any]:
        hp = scalar_hyperparams(self, None)
        hp["fast_optimizer"] = self.fast_optimizer.hyperparams(state.fast_state)
        return hp


Lookahead.__init__.__doc__ = r"""**Arguments:**

- `fast_optimizer`: the optimizer of the inner (fast) loop.
- `sync_period`: $k \ge 1$, the number of fast steps between synchronisations.
    (Static.)
- `slow_step_size`: $\alpha \in [0, 1]$, how far the slow params move towards the
    fast ones.
- `reset_state`: reset the fast optimizer's state (to its `init`) at each
    synchronisation. (Static.)
- `state_dtype`: dtype of the slow params (e.g. `jnp.float32` for low-precision
    params); default the param's. An [`eqxopt.Quantized`][] (or a dict
    `{"slow_params": ...}`) quantizes them. (Static.)
"""
