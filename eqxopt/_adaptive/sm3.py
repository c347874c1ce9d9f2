"""SM3: memory-efficient adaptive steps from per-axis accumulators."""

import functools as ft

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, Inexact, Int32, PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    abs_sq,
    compute_dtype,
    increment,
    is_none,
    is_param,
    out_dtype,
    pack,
    real_dtype,
    resolve,
    scalar,
    tree_map,
    typechecked,
    zero_count,
    zeros_like_leaf,
)
from .._quantized import buffers_like, plain_dtype, read, Stored, write


@typechecked
class SM3State(eqx.Module):
    """State of [`eqxopt.SM3`][] and [`eqxopt.ScaleBySM3`][]: the step count; per
    param, a tuple `mu` of accumulators, one vector per axis (a leaf of rank 0 or 1
    has one accumulator of its own shape); and the momentum buffer `nu` (`None`
    without momentum; it may be quantized: [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.SM3(0.1, momentum=0.9).init(params)
        assert [m.shape for m in state.mu["w"]] == [(2,), (3,)]  # one per axis
        assert state.nu["w"].shape == (2, 3)  # the momentum buffer
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Inexact[Array, "..."]]
    nu: PyTree[Stored] | None


def _accumulators(p, state_dtype):
    # The accumulators mirror no param (but a 0-d or 1-d one): a dtype `state_dtype`.
    dtype = real_dtype(plain_dtype(state_dtype) or p.dtype)
    if p.ndim <= 1:
        return (zeros_like_leaf(p, dtype),)
    return tuple(jnp.zeros((n,), dtype) for n in p.shape)


def _expand(v, ndim, axis):
    shape = [1] * ndim
    shape[axis] = v.shape[0]
    return v.reshape(shape)


def _sm3(opt, grads, state: SM3State, params, b1, lr):
    """One SM3-II step; `lr=None` returns the direction without the sign flip."""

    def _leaf(g, mu, nu, p):
        dtype = compute_dtype(g.dtype, *(m.dtype for m in mu))
        g32 = g.astype(dtype)
        real = real_dtype(dtype)  # the accumulators hold |g|^2
        if g.ndim <= 1:
            prev = mu[0].astype(real)
        else:
            prev = ft.reduce(
                jnp.minimum,
                [_expand(m.astype(real), g.ndim, i) for i, m in enumerate(mu)],
            )
        b2 = scalar(opt.b2, real)
        coeff = jnp.where(b2 == 1, jnp.ones((), real), 1 - b2)
        accum = coeff * abs_sq(g32) + b2 * prev
        inv = jnp.where(
            accum > 0, jnp.reciprocal(jnp.sqrt(accum + scalar(opt.eps, real))), 0
        )
        u = g32 * inv.astype(dtype)
        if nu is not None:
            b1_ = scalar(b1, dtype)
            u = (1 - b1_) * u + b1_ * read(nu, dtype)
            new_nu = write(u, nu)
        else:
            new_nu = None
        if g.ndim <= 1:
            new_mu = (accum.astype(mu[0].dtype),)
        else:
            axes = range(g.ndim)
            # `initial=0` (the accumulators are >= 0) for the axes of an empty leaf.
            new_mu = tuple(
                jnp.max(accum, axis=tuple(j for j in axes if j != i), initial=0).astype(
                    m.dtype
                )
                for i, m in enumerate(mu)
            )
        out = u if lr is None else u * -scalar(lr, dtype)
        return pack(out.astype(out_dtype(g, p)), new_mu, new_nu)

    # `state.mu` holds a tuple of accumulators at each param leaf: map over the grads'
    # leaves and take `mu`, `nu` and `params` up to that structure.
    leaves, treedef = jtu.tree_flatten(grads, is_leaf=is_none)

    def _up_to(tree, name):
        if tree is None:
            return [None] * len(leaves)
        try:
            return treedef.flatten_up_to(tree)
        except (ValueError, TypeError) as e:
            raise ValueError(
                f"eqxopt: `grads` and `{name}` must have the same tree structure "
                f"(`SM3`): {e}"
            ) from None

    out = [
        _leaf(g, m, n, p) if is_param(g) else pack(None, None, None)
        for g, m, n, p in zip(
            leaves,
            _up_to(state.mu, "state.mu"),
            _up_to(state.nu, "state.nu"),
            _up_to(params, "params"),
        )
    ]
    updates, mu, nu = (
        jtu.tree_unflatten(treedef, [o.values[i] for o in out]) for i in range(3)
    )
    nu = None if state.nu is None else nu
    return updates, SM3State(increment(state.count), mu, nu)


def _init(opt, params) -> SM3State:
    mu = tree_map(lambda p: _accumulators(p, opt.state_dtype), params)
    nu = (
        None
        if opt._momentum() is None
        else buffers_like(params, opt.state_dtype, "nu", False)
    )
    return SM3State(zero_count(), mu, nu)


def _buffers(opt) -> dict[str, bool]:
    # The momentum, if any, mirrors the params.
    return {} if opt._momentum() is None else {"nu": False}


class ScaleBySM3(AbstractOptimizer[SM3State]):
    r"""SM3's rescaling without the learning rate (see [`eqxopt.SM3`][]), with
    decay rates `b1` (momentum) and `b2` (accumulators; `1` sums them, as in the
    paper). Matches `optax.scale_by_sm3`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.ScaleBySM3(b1=0.9), eqxopt.ScaleByLearningRate(0.1))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    b1: ScalarLike | None = 0.9
    b2: ScalarLike = 1.0
    eps: ScalarLike = 1e-8
    state_dtype: object = eqx.field(default=None, static=True)

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("eps",),
            unit_interval=("b1",),
            closed_unit_interval=("b2",),
        )

    def _momentum(self):
        return self.b1

    def _param_buffers(self) -> dict[str, bool]:
        return _buffers(self)

    def init(self, params: Params) -> SM3State:
        return _init(self, params)

    def update(self, grads: Updates, state: SM3State, params=None, **extra):
        return _sm3(self, grads, state, params, self.b1, None)


class SM3(AbstractOptimizer[SM3State]):
    r"""SM3 (square-root of minima of sums of maxima of squared gradients): Adagrad's
    per-coordinate steps with one accumulator per tensor axis instead of per entry.

    For a leaf with axes $r = 1, \dots, d$ and accumulators $\mu_r$ (vectors along
    axis $r$; SM3-II),

    $$\nu_k(i) = \min_{r} \mu_{k-1,r}(i_r) + g_k(i)^2, \qquad
      \mu_{k,r}(j) = \max_{i:\,i_r = j} \nu_k(i)$$

    $$m_k = \beta\,m_{k-1} + (1 - \beta)\,\frac{g_k}{\sqrt{\nu_k + \epsilon}}, \qquad
      u_k = -\eta_k\, m_k$$

    with $0/0 = 0$ and $\epsilon = 10^{-8}$. Memory is $O(\sum_r n_r)$ per leaf rather
    than $O(\prod_r n_r)$ (plus the momentum, if any; `momentum=None` drops it).
    Matches `optax.sm3`; unlike Optax, it also accepts rank-0 leaves and a learning
    rate schedule.

    ??? cite "References"

        ```bibtex
        @inproceedings{anil2019memory,
            title={Memory-Efficient Adaptive Optimization},
            author={Anil, Rohan and Gupta, Vineet and Koren, Tomer and Singer, Yoram},
            booktitle={NeurIPS}, year={2019}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.SM3(0.1, momentum=0.9)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    momentum: ScalarLike | None = 0.9
    state_dtype: object = eqx.field(default=None, static=True)

    b2 = 1.0
    eps = 1e-8

    def __check_init__(self):
        check_hyperparams(
            self, nonnegative=("learning_rate",), unit_interval=("momentum",)
        )

    def _momentum(self):
        return self.momentum

    def _param_buffers(self) -> dict[str, bool]:
        return _buffers(self)

    def init(self, params: Params) -> SM3State:
        return _init(self, params)

    def update(self, grads: Updates, state: SM3State, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)
        return _sm3(self, grads, state, params, self.momentum, lr)


SM3.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule.
- `momentum`: decay rate $\beta$ of the momentum, in `[0, 1)`, or `None` for no
    momentum buffer.
- `state_dtype`: dtype of the accumulators and the momentum; default the param's.
    An [`eqxopt.Quantized`][] (or a dict `{"nu": ...}`) quantizes the momentum; the
    accumulators then keep the param's dtype. (Static.)
"""
ScaleBySM3.__init__.__doc__ = r"""**Arguments:**

- `b1`: decay rate of the momentum, in `[0, 1)`, or `None` for none.
- `b2`: decay rate of the accumulators, in `[0, 1]`; `1` (default) sums them.
- `eps`: added inside the square root.
- `state_dtype`: dtype of the accumulators and the momentum; default the param's.
    An [`eqxopt.Quantized`][] (or a dict `{"nu": ...}`) quantizes the momentum; the
    accumulators then keep the param's dtype. (Static.)
"""
