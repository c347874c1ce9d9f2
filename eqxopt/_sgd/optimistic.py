"""Optimistic methods for min-max problems: optimistic gradient descent and
optimistic Adam (and the `ScaleByOptimisticGradient` building block)."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    out_dtype,
    pack,
    resolve,
    scalar,
    sharded_like,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, read, Stored, write


@typechecked
class OptimisticGradientState(eqx.Module):
    """State of [`eqxopt.OptimisticGradientDescent`][] and
    [`eqxopt.ScaleByOptimisticGradient`][]: the step count and the previous incoming
    update (gradient), one leaf per param (it may be quantized:
    [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.OptimisticGradientDescent(0.1)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert jnp.all(state.previous["b"] == grads["b"])
        ```
    """

    count: Int32[Array, ""]
    previous: PyTree[Stored]


def _optimistic(opt, grads, state, params, lr):
    alpha = resolve(opt.alpha, state.count)
    beta = resolve(opt.beta, state.count)
    first = state.count == 0

    def _leaf(g, prev, p):
        dtype = compute_dtype(g.dtype, dtype_of(prev))
        g32 = sharded_like(g.astype(dtype), prev)  # split like `prev`: `shard_over`
        # The first step has no previous gradient: use the current one (as Optax).
        prev32 = jnp.where(first, g32, read(prev, dtype))
        a, b = scalar(alpha, dtype), scalar(beta, dtype)
        u = (a + b) * g32 - b * prev32
        if lr is not None:
            u = u * -scalar(lr, dtype)
        return pack(u.astype(out_dtype(g, p)), write(g32, prev))

    updates, previous = tree_map_unzip(
        _leaf,
        2,
        grads,
        state.previous,
        params,
        names=("grads", "state.previous", "params"),
    )
    return updates, OptimisticGradientState(increment(state.count), previous)


class ScaleByOptimisticGradient(AbstractOptimizer[OptimisticGradientState]):
    r"""The optimistic combination $u_k = (\alpha + \beta) g_k - \beta g_{k-1}$ of
    the incoming updates (no learning rate, no sign flip; $g_{-1} = g_0$). Matches
    `optax.scale_by_optimistic_gradient`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByOptimisticGradient(alpha=1.0, beta=1.0),
            eqxopt.ScaleByLearningRate(0.1),
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    alpha: ScalarOrSchedule = 1.0
    beta: ScalarOrSchedule = 1.0
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = {"previous": False}

    def init(self, params: Params) -> OptimisticGradientState:
        return OptimisticGradientState(
            zero_count(), buffers_like(params, self.state_dtype, "previous", False)
        )

    def update(
        self, grads: Updates, state: OptimisticGradientState, params=None, **extra
    ):
        return _optimistic(self, grads, state, params, None)


class OptimisticGradientDescent(AbstractOptimizer[OptimisticGradientState]):
    r"""Optimistic gradient descent: a cheap approximation of extra-gradient, with
    last-iterate convergence in min-max games where plain gradient descent cycles.

    $$u_k = -\eta_k \bigl((\alpha + \beta)\, g_k - \beta\, g_{k-1}\bigr)$$

    with $g_{-1} = g_0$. Matches `optax.optimistic_gradient_descent`.

    ??? cite "References"

        ```bibtex
        @inproceedings{mokhtari2020unified,
            title={A Unified Analysis of Extra-gradient and Optimistic Gradient
                Methods for Saddle Point Problems: Proximal Point Approach},
            author={Mokhtari, Aryan and Ozdaglar, Asuman and Pattathil, Sarath},
            booktitle={AISTATS}, year={2020}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.OptimisticGradientDescent(0.1, alpha=1.0, beta=1.0)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    alpha: ScalarOrSchedule = 1.0
    beta: ScalarOrSchedule = 1.0
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = {"previous": False}

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("learning_rate",))

    def init(self, params: Params) -> OptimisticGradientState:
        return OptimisticGradientState(
            zero_count(), buffers_like(params, self.state_dtype, "previous", False)
        )

    def update(
        self, grads: Updates, state: OptimisticGradientState, params=None, **extra
    ):
        lr = resolve(self.learning_rate, state.count)
        return _optimistic(self, grads, state, params, lr)

    _write_after_params = ("previous",)  # see `AbstractOptimizer.step`


@typechecked
class OptimisticAdamState(eqx.Module):
    """State of [`eqxopt.OptimisticAdam`][]: the step count, Adam's moments `mu` and
    `nu`, and the previous Adam direction `previous`, one leaf per param (each may be
    quantized: [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.OptimisticAdam(1e-3).init(params)
        state.mu["w"], state.nu["w"]  # Adam's moments
        state.previous["w"]  # the previous Adam direction
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Stored]
    nu: PyTree[Stored]
    previous: PyTree[Stored]


class OptimisticAdam(AbstractOptimizer[OptimisticAdamState]):
    r"""Optimistic Adam: the optimistic combination of successive Adam directions,
    for GANs and other min-max problems.

    With $r_k$ the (by default Nesterov) Adam direction
    $\hat m_k / (\sqrt{\hat v_k + \epsilon_{\rm root}} + \epsilon)$,

    $$u_k = -\eta_k \bigl((\alpha + \beta)\, r_k - \beta\, r_{k-1}\bigr),
      \qquad r_{-1} = r_0.$$

    Matches `optax.optimistic_adam_v2` (Optax's `optimistic_adam` is deprecated).

    ??? cite "References"

        ```bibtex
        @inproceedings{daskalakis2018training,
            title={Training {GANs} with Optimism},
            author={Daskalakis, Constantinos and Ilyas, Andrew and Syrgkanis, Vasilis
                and Zeng, Haoyang},
            booktitle={ICLR}, year={2018}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.OptimisticAdam(1e-3, alpha=1.0, beta=1.0)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    alpha: ScalarLike = eqx.field(default=1.0, kw_only=True)
    beta: ScalarLike = eqx.field(default=1.0, kw_only=True)
    b1: ScalarLike = eqx.field(default=0.9, kw_only=True)
    b2: ScalarLike = eqx.field(default=0.999, kw_only=True)
    eps: ScalarLike = eqx.field(default=1e-8, kw_only=True)
    eps_root: ScalarLike = eqx.field(default=0.0, kw_only=True)
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)
    nesterov: bool = eqx.field(default=True, static=True, kw_only=True)

    _state_buffers = {"mu": False, "nu": True, "previous": False}

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "eps", "eps_root"),
            unit_interval=("b1", "b2"),
        )

    def init(self, params: Params) -> OptimisticAdamState:
        return OptimisticAdamState(
            zero_count(),
            buffers_like(params, self.state_dtype, "mu", False),
            buffers_like(params, self.state_dtype, "nu", True),
            buffers_like(params, self.state_dtype, "previous", False),
        )

    def update(self, grads: Updates, state: OptimisticAdamState, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)
        first = state.count == 0
        count = increment(state.count)

        def _leaf(g, m, v, prev, p):
            dtype = compute_dtype(g.dtype, *map(dtype_of, (m, v, prev)))
            g32 = g.astype(dtype)
            b1, b2 = scalar(self.b1, dtype), scalar(self.b2, dtype)
            t = count.astype(dtype)
            m32 = (1 - b1) * g32 + b1 * read(m, dtype)
            v32 = (1 - b2) * abs_sq(g32) + b2 * read(v, dtype)
            if self.nesterov:
                m_hat = b1 * (m32 / (1 - b1 ** (t + 1))) + (1 - b1) * (
                    g32 / (1 - b1**t)
                )
            else:
                m_hat = m32 / (1 - b1**t)
            v_hat = v32 / (1 - b2**t)
            r = m_hat / (
                jnp.sqrt(v_hat + scalar(self.eps_root, dtype)) + scalar(self.eps, dtype)
            )
            prev32 = jnp.where(first, r, read(prev, dtype))
            a, b = scalar(self.alpha, dtype), scalar(self.beta, dtype)
            u = ((a + b) * r - b * prev32) * -scalar(lr, dtype)
            return pack(
                u.astype(out_dtype(g, p)),
                write(m32, m),
                write(v32, v),
                write(r, prev),
            )

        updates, mu, nu, previous = tree_map_unzip(
            _leaf,
            4,
            grads,
            state.mu,
            state.nu,
            state.previous,
            params,
            names=("grads", "state.mu", "state.nu", "state.previous", "params"),
        )
        return updates, OptimisticAdamState(count, mu, nu, previous)

    _write_after_params = ("previous",)  # see `AbstractOptimizer.step`


ScaleByOptimisticGradient.__init__.__doc__ = r"""**Arguments:**

- `alpha`, `beta`: the coefficients $\alpha, \beta$ (numbers or schedules).
- `state_dtype`: dtype of the stored previous update; default the param's. An
    [`eqxopt.Quantized`][] (or a dict `{"previous": ...}`) quantizes it. (Static.)
"""
OptimisticGradientDescent.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule.
- `alpha`: $\alpha$, the weight of the current gradient beyond $\beta$; default `1`.
- `beta`: $\beta$, the weight of the negative momentum; default `1`.
- `state_dtype`: dtype of the stored previous gradient; default the param's. An
    [`eqxopt.Quantized`][] (or a dict `{"previous": ...}`) quantizes it. (Static.)
"""
OptimisticAdam.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule.
- `alpha`, `beta`: the optimistic coefficients; default `1`. (Keyword-only.)
- `b1`, `b2`: Adam's decay rates, in `[0, 1)`. (Keyword-only.)
- `eps`, `eps_root`: Adam's $\epsilon$ outside and inside the root. (Keyword-only.)
- `state_dtype`: dtype of the three buffers (Optax's `mu_dtype`); default the
    param's. An [`eqxopt.Quantized`][] quantizes them, a dict keyed by `"mu"`, `"nu"`
    and `"previous"` each. (Static, keyword-only.)
- `nesterov`: Nesterov Adam direction; default `True` (as Optax). (Static,
    keyword-only.)
"""
