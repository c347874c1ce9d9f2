"""NovoGrad (and the `ScaleByNovograd` building block)."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Inexact, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._kernels import is_zero
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    out_dtype,
    pack,
    per_dtype,
    resolve,
    scalar,
    tree_map,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, plain_dtype, read, Stored, write


@typechecked
class NovogradState(eqx.Module):
    """State of [`eqxopt.Novograd`][] and [`eqxopt.ScaleByNovograd`][]: the step count,
    the first moment `mu` (one leaf per param) and the second moment `nu` (one scalar
    per param leaf: NovoGrad's second moment is layer-wise). A quantized `state_dtype`
    quantizes `mu` alone.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.Novograd(1e-2).init(params)
        assert state.mu["w"].shape == (2, 3)
        assert state.nu["w"].shape == ()  # one second moment per leaf
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Stored]
    nu: PyTree[Inexact[Array, ""]]


def _check(opt):
    check_hyperparams(
        opt,
        nonnegative=("eps", "eps_root", "weight_decay")
        + (("learning_rate",) if hasattr(opt, "learning_rate") else ()),
        unit_interval=("b1", "b2"),
    )


def _init(opt, params) -> NovogradState:
    # The layer-wise `nu` mirrors no param: a dtype `state_dtype` only.
    dtype = plain_dtype(opt.state_dtype)
    nu = tree_map(lambda p: jnp.zeros((), dtype or p.dtype), params)
    mu = buffers_like(params, opt.state_dtype, "mu", False)
    return NovogradState(zero_count(), mu, nu)


def _novograd_step(opt, grads, state: NovogradState, params, lr=None):
    if not is_zero(opt.weight_decay):
        need_params(opt, params, "for the weight decay")
    count = increment(state.count)
    first = count == 1
    decayed = not is_zero(opt.weight_decay)

    def _constants(dtype):
        b2 = scalar(opt.b2, dtype)
        return (
            scalar(opt.b1, dtype),
            b2,
            1 - b2,
            scalar(opt.eps, dtype),
            scalar(opt.eps_root, dtype),
            scalar(opt.weight_decay, dtype),
            None if lr is None else -scalar(lr, dtype),
        )

    constants = per_dtype(_constants)  # traced once per update, not once per leaf

    def _leaf(g, m, n, p):
        dtype = compute_dtype(g.dtype, dtype_of(m), n.dtype)
        b1, b2, one_minus_b2, eps, eps_root, wd, neg_lr = constants(dtype)
        g32 = g.astype(dtype)
        sq_norm = jnp.sum(abs_sq(g32))
        # The first step starts the layer-wise second moment at ||g||^2.
        n32 = jnp.where(first, sq_norm, one_minus_b2 * sq_norm + b2 * n.astype(dtype))
        d = g32 / (jnp.sqrt(n32 + eps_root) + eps)
        if decayed:
            d = d + wd * p.astype(dtype)
        # `mu` starts at zero, so the first step's `b1 * mu + d` is `d`, as in Optax.
        m32 = b1 * read(m, dtype) + d
        update = m32 if neg_lr is None else m32 * neg_lr
        return pack(update.astype(out_dtype(g, p)), write(m32, m), n32.astype(n.dtype))

    updates, mu, nu = tree_map_unzip(
        _leaf,
        3,
        grads,
        state.mu,
        state.nu,
        params,
        names=("grads", "state.mu", "nu (one per leaf)", "params"),
    )
    return updates, NovogradState(count, mu, nu)


class ScaleByNovograd(AbstractOptimizer[NovogradState]):
    r"""NovoGrad's direction without the learning rate: the momentum $m_k$ of
    [`eqxopt.Novograd`][]. Matches `optax.scale_by_novograd`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByNovograd(b1=0.9, b2=0.25), eqxopt.ScaleByLearningRate(1e-2)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.25
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 0.0
    weight_decay: ScalarLike = 0.0
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = {"mu": False}

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> NovogradState:
        return _init(self, params)

    def update(self, grads: Updates, state: NovogradState, params=None, **extra):
        return _novograd_step(self, grads, state, params)


class Novograd(AbstractOptimizer[NovogradState]):
    r"""NovoGrad: layer-wise (per param leaf) second moments, with the gradient
    normalized before the momentum.

    $$v_k = \beta_2 v_{k-1} + (1-\beta_2)\,\|g_k\|^2 \quad (v_1 = \|g_1\|^2)$$

    $$m_k = \beta_1 m_{k-1} + \frac{g_k}{\sqrt{v_k + \epsilon_{\rm root}} + \epsilon}
      + \lambda\,p_k, \qquad u_k = -\eta_k\, m_k$$

    with the norm over each param leaf and $m_0 = 0$. Matches `optax.novograd`.

    ??? cite "References"

        ```bibtex
        @article{ginsburg2019stochastic,
            title={Stochastic Gradient Methods with Layer-wise Adaptive Moments for
                Training of Deep Networks},
            author={Ginsburg, Boris and Castonguay, Patrice and Hrinchuk, Oleksii and
                Kuchaiev, Oleksii and Lavrukhin, Vitaly and Leary, Ryan and Li, Jason
                and Nguyen, Huyen and Zhang, Yang and Cohen, Jonathan M.},
            journal={arXiv:1905.11286}, year={2019}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Novograd(1e-2, weight_decay=1e-3)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.25
    eps: ScalarLike = 1e-6
    eps_root: ScalarLike = 0.0
    weight_decay: ScalarLike = 0.0
    state_dtype: object = eqx.field(default=None, static=True, kw_only=True)

    _state_buffers = {"mu": False}

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> NovogradState:
        return _init(self, params)

    def update(self, grads: Updates, state: NovogradState, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)
        return _novograd_step(self, grads, state, params, lr)


_ARGS = r"""- `b1`: momentum decay $\beta_1$, in `[0, 1)`.
- `b2`: decay rate $\beta_2$ of the layer-wise second moment, in `[0, 1)`.
- `eps`: $\epsilon$, added to the denominator outside the root.
- `eps_root`: $\epsilon_{\rm root}$, added inside the root.
- `weight_decay`: $\lambda$, added to the normalized gradient (needs `params` unless
    it is `0`).
"""
_QUANTIZED = """
    An [`eqxopt.Quantized`][] (or a dict `{"mu": ...}`) quantizes the first moment;
    the layer-wise second moment then keeps the param's dtype. """
Novograd.__init__.__doc__ = (
    "**Arguments:**\n\n"
    r"- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`."
    "\n"
    + _ARGS
    + "- `state_dtype`: dtype of both moments; default the param's."
    + _QUANTIZED
    + "(Static, keyword-only.)\n"
)
ScaleByNovograd.__init__.__doc__ = (
    "**Arguments:**\n\n"
    + _ARGS
    + "- `state_dtype`: dtype of both moments (Optax's `mu_dtype`); default the "
    "param's." + _QUANTIZED + "(Static.)\n"
)
