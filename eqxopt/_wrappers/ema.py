"""Exponential moving averages: of the updates (`EMA`), and of the params for
evaluation (`ParamsEMA`)."""

from typing import Any, Generic

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer, child_update, scalar_hyperparams
from .._custom_types import Params, ScalarLike, State, Updates
from .._misc import (
    compute_dtype,
    increment,
    out_dtype,
    pack,
    scalar,
    tree_map,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, copy_like, dtype_of, read, Stored, write


@typechecked
class EMAState(eqx.Module):
    """State of [`eqxopt.EMA`][]: the step count and the moving average, one leaf per
    param (it may be quantized: [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.EMA(decay=0.9)
        state = opt.init(params)
        updates, state = opt.update(grads, state)
        assert jnp.allclose(state.ema["b"], 0.1 * grads["b"])  # stored not debiased
        ```
    """

    count: Int32[Array, ""]
    ema: PyTree[Stored]


class EMA(AbstractOptimizer[EMAState]):
    r"""Replace the updates by their exponential moving average.

    $$e_k = \beta\, e_{k-1} + (1-\beta)\, u_k, \qquad
      u_k \mapsto e_k \ \bigl(\text{or } e_k / (1 - \beta^{k}) \text{ with }
      \texttt{debias}\bigr)$$

    Matches `optax.ema` (`accumulator_dtype` is called `state_dtype` here). For a
    moving average of the *parameters* (to evaluate or checkpoint), see
    [`eqxopt.ParamsEMA`][].

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.EMA(decay=0.9), eqxopt.ScaleByLearningRate(0.1))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # steps along the debiased average of the grads (momentum)
        ```
    """

    decay: ScalarLike
    debias: bool = eqx.field(default=True, static=True)
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = {"ema": False}

    def __check_init__(self):
        check_hyperparams(self, unit_interval=("decay",))

    def init(self, params: Params) -> EMAState:
        ema = buffers_like(params, self.state_dtype, "ema", False)
        return EMAState(zero_count(), ema)

    def update(self, grads: Updates, state: EMAState, params=None, **extra):
        count = increment(state.count)

        def _leaf(g, e, p):
            dtype = compute_dtype(g.dtype, dtype_of(e))
            decay = scalar(self.decay, dtype)
            e32 = (1 - decay) * g.astype(dtype) + decay * read(e, dtype)
            u = e32 / (1 - decay ** count.astype(dtype)) if self.debias else e32
            return pack(u.astype(out_dtype(g, p)), write(e32, e))

        updates, ema = tree_map_unzip(
            _leaf, 2, grads, state.ema, params, names=("grads", "state.ema", "params")
        )
        return updates, EMAState(count, ema)


@typechecked
class ParamsEMAState(eqx.Module, Generic[State]):
    """State of [`eqxopt.ParamsEMA`][]: the wrapped optimizer's state, the number of
    updates averaged, and the moving average of the params, one leaf per param (it may
    be quantized: [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.ParamsEMA(eqxopt.SGD(0.1), decay=0.9)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert state.count == 1
        state.ema["w"]  # the average of the params, what `opt.eval_params` returns
        ```
    """

    inner_state: State
    count: Int32[Array, ""]
    ema: PyTree[Stored]


class ParamsEMA(AbstractOptimizer[ParamsEMAState]):
    r"""Keep an exponential moving average of the params (Polyak-Ruppert / "EMA
    weights") alongside any optimizer, for evaluation and checkpoints.

    The updates of `optimizer` pass through unchanged; after each update the
    average of the *new* params $p_{k+1} = p_k + u_k$ is

    $$e_{k+1} = \beta\, e_k + (1-\beta)\, p_{k+1}, \qquad
      \bar p = e_{k+1} / (1 - \beta^{k+1}) \ \text{(with }\texttt{debias}\text{)}$$

    starting from $e_0 = 0$, so with `debias=True` (default) the average is a proper
    weighted mean of the params seen so far, with no pull towards the initial params.
    With `debias=False` the average starts from the initial params instead
    ($e_0 = p_0$, as `timm`'s model EMA). Read it with
    [`eqxopt.ParamsEMA.eval_params`][]. This plays the role of keeping
    `optax.ema`/`optax.incremental_update` of params by hand.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.ParamsEMA(eqxopt.AdamW(1e-3), decay=0.999)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        eval_params = opt.eval_params(state, params)  # the averaged weights
        ```
    """

    optimizer: AbstractOptimizer
    decay: ScalarLike = 0.999
    debias: bool = eqx.field(default=True, static=True)
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = {"ema": False}

    def __check_init__(self):
        if not isinstance(self.optimizer, AbstractOptimizer):
            raise ValueError(
                "`ParamsEMA(optimizer=...)` must be an eqxopt optimizer, got "
                f"{type(self.optimizer).__name__}."
            )
        check_hyperparams(self, unit_interval=("decay",))

    def init(self, params: Params) -> ParamsEMAState:
        if self.debias:
            ema = buffers_like(params, self.state_dtype, "ema", False)
        else:
            ema = copy_like(params, self.state_dtype, "ema")
        return ParamsEMAState(self.optimizer.init(params), zero_count(), ema)

    def update(self, grads: Updates, state: ParamsEMAState, params=None, **extra):
        need_params(self, params)
        updates, inner_state = child_update(
            self.optimizer, ".inner_state", grads, state.inner_state, params, **extra
        )

        def _leaf(u, p, e):
            # The params exactly as `eqx.apply_updates` will produce them.
            new_p = (p + u.astype(p.dtype)).astype(p.dtype)
            dtype = compute_dtype(new_p.dtype, dtype_of(e))
            decay = scalar(self.decay, dtype)
            e32 = (1 - decay) * new_p.astype(dtype) + decay * read(e, dtype)
            return write(e32, e)

        ema = tree_map(
            _leaf, updates, params, state.ema, names=("updates", "params", "state.ema")
        )
        return updates, ParamsEMAState(inner_state, increment(state.count), ema)

    def eval_params(self, state: ParamsEMAState, params: Params) -> Params:
        """The averaged params, in the params' dtypes (non-array leaves are taken
        from `params`). Before the first update this is `params` itself."""

        def _leaf(p, e):
            if not self.debias:
                return read(e, p.dtype)
            dtype = compute_dtype(p.dtype, dtype_of(e))
            decay = scalar(self.decay, dtype)
            correction = 1 - decay ** state.count.astype(dtype)
            safe = jnp.where(state.count == 0, jnp.ones_like(correction), correction)
            avg = read(e, dtype) / safe
            return jnp.where(state.count == 0, p.astype(dtype), avg).astype(p.dtype)

        averaged = tree_map(_leaf, params, state.ema, names=("params", "state.ema"))
        return eqx.combine(averaged, params, is_leaf=lambda x: x is None)

    def hyperparams(self, state: ParamsEMAState) -> dict[str, Any]:
        hp = scalar_hyperparams(self, state.count)
        hp["optimizer"] = self.optimizer.hyperparams(state.inner_state)
        return hp


EMA.__init__.__doc__ = r"""**Arguments:**

- `decay`: $\beta$, in `[0, 1)`.
- `debias`: divide by $1 - \beta^k$. (Static.)
- `state_dtype`: dtype of the average (Optax's `accumulator_dtype`); default the
    param's. An [`eqxopt.Quantized`][] (or a dict `{"ema": ...}`) quantizes it.
    (Static.)
"""
ParamsEMA.__init__.__doc__ = r"""**Arguments:**

- `optimizer`: the optimizer whose params to average.
- `decay`: $\beta$, in `[0, 1)`; default `0.999`.
- `debias`: start the average at 0 and divide by $1 - \beta^k$ (default), or start
    it at the initial params. (Static.)
- `state_dtype`: dtype of the average (e.g. `jnp.float32` for low-precision
    params); default the param's. An [`eqxopt.Quantized`][] (or a dict
    `{"ema": ...}`) quantizes it. (Static.)
"""
