"""Rprop: per-coordinate step sizes adapted from the signs of successive gradients."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, Updates
from .._misc import (
    compute_dtype,
    out_dtype,
    pack,
    scalar,
    sharded_like,
    tree_map,
    tree_map_unzip,
    typechecked,
)
from .._quantized import (
    buffers_like,
    dtype_of,
    new_buffer,
    plain_dtype,
    read,
    storage_of,
    Stored,
    write,
)


@typechecked
class RpropState(eqx.Module):
    """State of [`eqxopt.Rprop`][]: the per-coordinate step sizes and the previous
    (unsigned) updates, one leaf per param (each may be quantized:
    [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        opt = eqxopt.Rprop(1e-3)
        state = opt.init(params)
        assert jnp.all(state.step_sizes["w"] == 1e-3)  # one step size per coordinate
        state.prev_updates["w"]
        ```
    """

    step_sizes: PyTree[Stored]
    prev_updates: PyTree[Stored]


class Rprop(AbstractOptimizer[RpropState]):
    r"""Rprop (resilient backpropagation, the iRprop$^-$ variant): each coordinate
    moves by its own step size along the sign of its gradient; the step grows while
    the sign persists and shrinks when it flips.

    With $s = g_k \cdot d_{k-1}$ (the previous step $d_{k-1}$, elementwise),

    $$\Delta_k = \begin{cases} \operatorname{clip}(\eta^+ \Delta_{k-1}) & s > 0 \\
      \operatorname{clip}(\eta^- \Delta_{k-1}) & s < 0 \\
      \Delta_{k-1} & s = 0 \end{cases}, \qquad
      d_k = \begin{cases} 0 & s < 0 \\ \Delta_k \operatorname{sign}(g_k) &
      \text{otherwise}\end{cases}, \qquad u_k = -d_k$$

    clipped to `[min_step_size, max_step_size]`, with $\Delta_0$ = `learning_rate`.
    Arguments and state follow `optax.rprop`, but the numbers follow the paper and
    `torch.optim.Rprop`: optax 0.2.8 returns the *previous* step's update (one step
    stale, and zero at the first step), which eqxopt does not copy.

    ??? cite "References"

        ```bibtex
        @inproceedings{riedmiller1993direct,
            title={A direct adaptive method for faster backpropagation learning: the
                {RPROP} algorithm},
            author={Riedmiller, Martin and Braun, Heinrich},
            booktitle={IEEE International Conference on Neural Networks},
            year={1993}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Rprop(1e-3, eta_minus=0.5, eta_plus=1.2)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarLike
    eta_minus: ScalarLike = 0.5
    eta_plus: ScalarLike = 1.2
    min_step_size: ScalarLike = 1e-6
    max_step_size: ScalarLike = 50.0
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = {"step_sizes": True, "prev_updates": False}

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "min_step_size", "max_step_size"),
            positive=("eta_minus", "eta_plus"),
        )

    real_only = "it compares the signs of successive gradients"

    def init(self, params: Params) -> RpropState:
        storage = storage_of(self.state_dtype, "step_sizes")

        def _full(p):
            value = scalar(self.learning_rate, plain_dtype(storage) or p.dtype)
            return new_buffer(p, value, storage, True)

        prev = buffers_like(params, self.state_dtype, "prev_updates", False)
        return RpropState(tree_map(_full, params), prev)

    def update(self, grads: Updates, state: RpropState, params=None, **extra):
        def _leaf(g, step, prev, p):
            dtype = compute_dtype(g.dtype, dtype_of(step), dtype_of(prev))
            g32, step32, prev32 = (
                sharded_like(g.astype(dtype), step),  # split like `step`: `shard_over`
                read(step, dtype),
                read(prev, dtype),
            )
            s = g32 * prev32
            factor = jnp.where(
                s > 0, scalar(self.eta_plus, dtype), scalar(self.eta_minus, dtype)
            )
            grown = jnp.clip(
                step32 * factor,
                scalar(self.min_step_size, dtype),
                scalar(self.max_step_size, dtype),
            )
            step32 = jnp.where(s == 0, step32, grown)
            d = jnp.where(s < 0, jnp.zeros_like(g32), step32 * jnp.sign(g32))
            return pack(
                (-d).astype(out_dtype(g, p)),
                write(step32, step),
                write(d, prev),
            )

        updates, step_sizes, prev = tree_map_unzip(
            _leaf,
            3,
            grads,
            state.step_sizes,
            state.prev_updates,
            params,
            names=("grads", "state.step_sizes", "state.prev_updates", "params"),
        )
        return updates, RpropState(step_sizes, prev)


Rprop.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: the initial step size $\Delta_0$ of every coordinate.
- `eta_minus`: factor $\eta^-$ applied to a step when its gradient flips sign.
- `eta_plus`: factor $\eta^+$ applied to a step when its gradient keeps its sign.
- `min_step_size`, `max_step_size`: bounds on the step sizes.
- `state_dtype`: dtype of both buffers; default the param's. An
    [`eqxopt.Quantized`][] quantizes them, a dict keyed by `"step_sizes"` and
    `"prev_updates"` each. (Static.)
"""
