"""Sign-based methods: SignSGD, Signum, and the `ScaleBySign` building block."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer, CountState, EmptyState
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    compute_dtype,
    increment,
    out_dtype,
    pack,
    resolve,
    scalar,
    tree_map,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, read, Stored, write


class ScaleBySign(AbstractOptimizer[EmptyState]):
    r"""Replace every update element by its sign: $u \mapsto \operatorname{sign}(u)$.
    Matches `optax.scale_by_sign`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.ScaleBySign(), eqxopt.ScaleByLearningRate(0.01))
        updates, state = opt.update(grads, opt.init(params))
        assert jnp.allclose(updates["b"], -0.01 * jnp.sign(grads["b"]))
        ```
    """

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        def _leaf(g, p):
            return jnp.sign(g).astype(out_dtype(g, p))

        return tree_map(_leaf, grads, params, names=("grads", "params")), state


class SignSGD(AbstractOptimizer[CountState]):
    r"""SignSGD: descend along the sign of each gradient component.

    $$u_k = -\eta_k\,\operatorname{sign}(g_k)$$

    Matches `optax.sign_sgd`.

    ??? cite "References"

        ```bibtex
        @inproceedings{bernstein2018signsgd,
            title={{signSGD}: Compressed Optimisation for Non-Convex Problems},
            author={Bernstein, Jeremy and Wang, Yu-Xiang and Azizzadenesheli, Kamyar
                and Anandkumar, Animashree},
            booktitle={ICML}, year={2018}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.SignSGD(1e-3)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("learning_rate",))

    def init(self, params: Params) -> CountState:
        return CountState(zero_count())

    def update(self, grads: Updates, state: CountState, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)

        def _leaf(g, p):
            dtype = compute_dtype(g.dtype)
            u = jnp.sign(g.astype(dtype)) * -scalar(lr, dtype)
            return u.astype(out_dtype(g, p))

        updates = tree_map(_leaf, grads, params, names=("grads", "params"))
        return updates, CountState(increment(state.count))


@typechecked
class SignumState(eqx.Module):
    """State of [`eqxopt.Signum`][]: the step count and the (not debiased)
    exponential moving average of the gradients, one leaf per param (it may be
    quantized: [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Signum(1e-3, beta=0.9)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert jnp.allclose(state.ema["b"], 0.1 * grads["b"])  # not debiased
        ```
    """

    count: Int32[Array, ""]
    ema: PyTree[Stored]


class Signum(AbstractOptimizer[SignumState]):
    r"""Signum: SignSGD on an exponential moving average of the gradients.

    $$m_k = \beta\,m_{k-1} + (1-\beta)\,g_k, \qquad
      u_k = -\eta_k\,\operatorname{sign}(m_k)$$

    Matches `optax.signum` (`accumulator_dtype` is called `state_dtype` here).

    ??? cite "References"

        ```bibtex
        @inproceedings{bernstein2018signsgd,
            title={{signSGD}: Compressed Optimisation for Non-Convex Problems},
            author={Bernstein, Jeremy and Wang, Yu-Xiang and Azizzadenesheli, Kamyar
                and Anandkumar, Animashree},
            booktitle={ICML}, year={2018}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Signum(1e-3, beta=0.9)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    beta: ScalarLike = 0.9
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = {"ema": False}

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("learning_rate",), unit_interval=("beta",))

    def init(self, params: Params) -> SignumState:
        return SignumState(
            zero_count(), buffers_like(params, self.state_dtype, "ema", False)
        )

    def update(self, grads: Updates, state: SignumState, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)

        def _leaf(g, m, p):
            dtype = compute_dtype(g.dtype, dtype_of(m))
            beta = scalar(self.beta, dtype)
            m32 = (1 - beta) * g.astype(dtype) + beta * read(m, dtype)
            u = jnp.sign(m32) * -scalar(lr, dtype)
            return pack(u.astype(out_dtype(g, p)), write(m32, m))

        updates, ema = tree_map_unzip(
            _leaf,
            2,
            grads,
            state.ema,
            params,
            names=("grads", "state.ema", "params"),
        )
        return updates, SignumState(increment(state.count), ema)


SignSGD.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule.
"""
Signum.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule.
- `beta`: decay rate $\beta$ of the moving average, in `[0, 1)`.
- `state_dtype`: dtype of the moving average (Optax's `accumulator_dtype`); default
    the param's. An [`eqxopt.Quantized`][] (or a dict `{"ema": ...}`) quantizes it.
    (Static.)
"""
ScaleBySign.__init__.__doc__ = "**Arguments:** none."
