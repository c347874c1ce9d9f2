"""Adan: adaptive Nesterov momentum (and the `ScaleByAdaN` building block)."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._filter_spec import decay_mask
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    mask_field,
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
class AdaNState(eqx.Module):
    """State of [`eqxopt.AdaN`][] and [`eqxopt.ScaleByAdaN`][]: the step count, the
    EMAs of the gradients (`m`), of the gradient differences (`v`) and of the squared
    Nesterov term (`n`), and the previous gradient (`prev_grad`), one leaf per
    param (each may be quantized: [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.AdaN(1e-3)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert jnp.all(state.prev_grad["b"] == grads["b"])  # for the next difference
        ```
    """

    count: Int32[Array, ""]
    m: PyTree[Stored]
    v: PyTree[Stored]
    n: PyTree[Stored]
    prev_grad: PyTree[Stored]


def _check(opt):
    check_hyperparams(
        opt,
        nonnegative=("eps", "eps_root")
        + (("learning_rate", "weight_decay") if hasattr(opt, "learning_rate") else ()),
        unit_interval=("b1", "b2", "b3"),
    )


# The buffers, and whether each is non-negative.
_BUFFERS = {"m": False, "v": False, "n": True, "prev_grad": False}


def _init(opt, params) -> AdaNState:
    buffers = (buffers_like(params, opt.state_dtype, *b) for b in _BUFFERS.items())
    return AdaNState(zero_count(), *buffers)


def _adan(opt, grads, state: AdaNState, params, leaf_update, mask=None):
    first = state.count == 0
    count = increment(state.count)

    def _leaf(g, m, v, n, g_prev, p, selected):
        dtype = compute_dtype(g.dtype, *map(dtype_of, (m, v, n, g_prev)))
        g32 = sharded_like(g.astype(dtype), m)  # split like `m` under `shard_over`
        b1, b2, b3 = (scalar(b, dtype) for b in (opt.b1, opt.b2, opt.b3))
        t = count.astype(dtype)
        diff = jnp.where(first, jnp.zeros_like(g32), g32 - read(g_prev, dtype))
        m32 = (1 - b1) * g32 + b1 * read(m, dtype)
        v32 = (1 - b2) * diff + b2 * read(v, dtype)
        n32 = (1 - b3) * abs_sq(g32 + (1 - b2) * diff) + b3 * read(n, dtype)
        m_hat = m32 / (1 - b1**t)
        v_hat = v32 / (1 - b2**t)
        n_hat = n32 / (1 - b3**t)
        direction = (m_hat + (1 - b2) * v_hat) / (
            jnp.sqrt(n_hat + scalar(opt.eps_root, dtype)) + scalar(opt.eps, dtype)
        )
        u = leaf_update(direction, p, selected)
        return pack(
            u.astype(out_dtype(g, p)),
            write(m32, m),
            write(v32, v),
            write(n32, n),
            write(g32, g_prev),
        )

    updates, m, v, n, g_prev = tree_map_unzip(
        _leaf,
        5,
        grads,
        state.m,
        state.v,
        state.n,
        state.prev_grad,
        params,
        mask,
        names=(
            "grads",
            "state.m",
            "state.v",
            "state.n",
            "state.prev_grad",
            "params",
            "mask",
        ),
    )
    return updates, AdaNState(count, m, v, n, g_prev)


class ScaleByAdaN(AbstractOptimizer[AdaNState]):
    r"""Adan's direction without learning rate, weight decay or sign flip (see
    [`eqxopt.AdaN`][]). Matches `optax.scale_by_adan`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByAdaN(b1=0.98, b2=0.92, b3=0.99),
            eqxopt.ScaleByLearningRate(1e-3),
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    b1: ScalarLike = 0.98
    b2: ScalarLike = 0.92
    b3: ScalarLike = 0.99
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 0.0
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = _BUFFERS

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdaNState:
        return _init(self, params)

    def update(self, grads: Updates, state: AdaNState, params=None, **extra):
        return _adan(self, grads, state, params, lambda d, p, s: d)


class AdaN(AbstractOptimizer[AdaNState]):
    r"""Adan: adaptive Nesterov momentum, estimated from gradient differences so that
    no gradient is needed at an extrapolated point.

    With $\Delta_k = g_k - g_{k-1}$ ($\Delta_0 = 0$),

    $$m_k = \beta_1 m_{k-1} + (1-\beta_1) g_k, \qquad
      v_k = \beta_2 v_{k-1} + (1-\beta_2)\Delta_k$$

    $$n_k = \beta_3 n_{k-1} + (1-\beta_3)\bigl(g_k + (1-\beta_2)\Delta_k\bigr)^2$$

    $$u_k = -\eta_k \left( \frac{\hat m_k + (1-\beta_2)\,\hat v_k}
      {\sqrt{\hat n_k + \epsilon_{\rm root}} + \epsilon} + \lambda\, p_k \right)$$

    with bias-corrected $\hat m, \hat v, \hat n$. Note that `b1, b2, b3` are decay
    rates (Optax's convention): the paper's $\beta_i$ are `1 - b_i`. The weight decay
    is added to the direction (Optax's implementation), rather than the paper's
    proximal $1/(1 + \lambda\eta)$ form. Matches `optax.adan`.

    ??? cite "References"

        ```bibtex
        @article{xie2024adan,
            title={Adan: Adaptive {Nesterov} Momentum Algorithm for Faster Optimizing
                Deep Models},
            author={Xie, Xingyu and Zhou, Pan and Li, Huan and Lin, Zhouchen and
                Yan, Shuicheng},
            journal={IEEE TPAMI}, year={2024}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.AdaN(1e-3, weight_decay=0.02)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.98
    b2: ScalarLike = 0.92
    b3: ScalarLike = 0.99
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 1e-8
    weight_decay: ScalarOrSchedule = 0.0
    mask: FilterSpec | None = mask_field(default=None)
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = _BUFFERS

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdaNState:
        return _init(self, params)

    def update(self, grads: Updates, state: AdaNState, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)
        wd = resolve(self.weight_decay, state.count)
        decay = not (isinstance(wd, (int, float)) and not wd)
        if decay:
            need_params(self, params, "for the weight decay")
        mask = decay_mask(self.mask, params) if decay else None

        def _leaf_update(d, p, selected):
            if decay and selected is not False:
                d = d + scalar(wd, d.dtype) * p.astype(d.dtype)
            return d * -scalar(lr, d.dtype)

        return _adan(self, grads, state, params, _leaf_update, mask)

    _write_after_params = ("prev_grad",)  # see `AbstractOptimizer.step`


_ARGS = r"""- `b1`: decay rate of the gradient EMA $m$, in `[0, 1)`.
- `b2`: decay rate of the gradient-difference EMA $v$, in `[0, 1)`.
- `b3`: decay rate of the squared-term EMA $n$, in `[0, 1)`.
- `eps`, `eps_root`: $\epsilon$ outside and $\epsilon_{\rm root}$ inside the root.
"""
_STATE_DTYPE = """- `state_dtype`: dtype of the four buffers; default the param's. An
    [`eqxopt.Quantized`][] quantizes them, a dict keyed by `"m"`, `"v"`, `"n"` and
    `"prev_grad"` each. (Static.)
"""
AdaN.__init__.__doc__ = (
    "**Arguments:**\n\n- `learning_rate`: $\\eta$; a number, an array, or a "
    "schedule.\n"
    + _ARGS
    + "- `weight_decay`: $\\lambda$, a number or a schedule; default `0`.\n"
    "- `mask`: which leaves are decayed, as a filter spec; default all.\n"
    + _STATE_DTYPE
)
ScaleByAdaN.__init__.__doc__ = "**Arguments:**\n\n" + _ARGS + _STATE_DTYPE
