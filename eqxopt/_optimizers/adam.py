"""Adam and AdamW (and the `ScaleByAdam` building block they share), and the per-leaf
helpers the Adam family, Lion, Lamb, RMSProp, ... share."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Inexact, Int32, PyTree

from .._base import AbstractOptimizer
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    abs_sq,
    check_hyperparams,
    compute_dtype,
    full_like_leaf,
    increment,
    mask_field,
    out_dtype,
    pack,
    per_dtype,
    resolve,
    scalar,
    tree_map,
    tree_map_unzip,
    typechecked,
    zero_count,
    zeros_like,
)
from .._transform.weight_decay import decay_mask


@typechecked
class AdamState(eqx.Module):
    """State of [`eqxopt.Adam`][], [`eqxopt.AdamW`][], [`eqxopt.ScaleByAdam`][] and of
    Adam's relatives that keep the same two moments ([`eqxopt.NAdam`][],
    [`eqxopt.NAdamW`][], [`eqxopt.Adamax`][], [`eqxopt.AdamaxW`][],
    [`eqxopt.RAdam`][], [`eqxopt.AdaBelief`][], [`eqxopt.Yogi`][], [`eqxopt.Lamb`][]
    and their `ScaleBy*` blocks): the step count and the first and second moments
    (for Adamax the infinity norm, for AdaBelief the belief), one leaf per param.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.Adam(1e-3).init(params)
        assert state.count == 0  # int32 step count
        assert state.mu["w"].shape == (2, 3)  # first moment, like params["w"]
        assert state.nu["w"].dtype == params["w"].dtype  # second moment
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Inexact[Array, "..."]]
    nu: PyTree[Inexact[Array, "..."]]


def _check(opt):
    check_hyperparams(
        opt,
        nonnegative=("eps", "eps_root")
        + (("learning_rate",) if hasattr(opt, "learning_rate") else ())
        + (("weight_decay",) if hasattr(opt, "weight_decay") else ()),
        unit_interval=("b1", "b2"),
    )


def _init(opt, params: Params) -> AdamState:
    return AdamState(
        zero_count(),
        zeros_like(params, opt.state_dtype),
        zeros_like(params, opt.state_dtype),
    )


def full_like(params, value, dtype=None):
    """`value` at every optimized leaf, in `dtype` or else the leaf's own dtype."""
    return tree_map(lambda p: full_like_leaf(p, value, dtype or p.dtype), params)


# --- per-leaf helpers shared by the Adam family (and Lion, Lamb, ...) ---------------
# They take and return arrays already cast to the compute dtype; hyperparameters may be
# numbers, arrays or tracers, and are cast explicitly (strict promotion).


def ema(x: Array, m: Array, decay) -> Array:
    r"""One step of an exponential moving average: $(1 - d)\,x + d\,m$."""
    d = scalar(decay, x.dtype)
    return (1 - d) * x + d * m


def debias(m: Array, decay, t: Array) -> Array:
    """Bias correction of an EMA after `t` steps: $m / (1 - d^t)$."""
    d = scalar(decay, m.dtype)
    return m / (1 - d ** t.astype(m.dtype))


def nesterov_debias(m: Array, g: Array, b1, t: Array) -> Array:
    r"""Nesterov's look-ahead first moment (NAdam, as Optax):
    $\beta_1 m / (1 - \beta_1^{t+1}) + (1 - \beta_1)\,g / (1 - \beta_1^t)$."""
    b = scalar(b1, m.dtype)
    t = t.astype(m.dtype)
    return b * (m / (1 - b ** (t + 1))) + (1 - b) * (g / (1 - b**t))


def first_moment_hat(m: Array, g: Array, b1, t: Array, nesterov: bool) -> Array:
    return nesterov_debias(m, g, b1, t) if nesterov else debias(m, b1, t)


def adam_moments(b1, b2, eps, eps_root, nesterov: bool = False):
    """Adam's per-leaf rule, for [`adam_family_step`][]. The same arithmetic as
    [`ema`][], [`first_moment_hat`][] and [`debias`][], with its scalars computed once
    per update (per `t`) instead of once per leaf."""
    cache = {}

    def constants(t):
        # `t` is the same array for every leaf of one dtype (see `adam_family_step`);
        # the cache holds it, so its `id` stays unique while the cache lives.
        key = (id(t), np.dtype(t.dtype))
        if key not in cache:
            d1, d2 = scalar(b1, t.dtype), scalar(b2, t.dtype)
            c = {
                "b1": d1,
                "1-b1": 1 - d1,
                "b2": d2,
                "1-b2": 1 - d2,
                "1-b1^t": 1 - d1**t,
                "1-b2^t": 1 - d2**t,
                "eps": scalar(eps, t.dtype),
                "eps_root": None if is_zero(eps_root) else scalar(eps_root, t.dtype),
            }
            if nesterov:
                c["1-b1^(t+1)"] = 1 - d1 ** (t + 1)
            cache[key] = (t, c)
        return cache[key][1]

    def moments(g, m, v, t):
        c = constants(t)
        m = c["1-b1"] * g + c["b1"] * m
        v = c["1-b2"] * abs_sq(g) + c["b2"] * v
        if nesterov:
            m_hat = c["b1"] * (m / c["1-b1^(t+1)"]) + c["1-b1"] * (g / c["1-b1^t"])
        else:
            m_hat = m / c["1-b1^t"]
        v_hat = v / c["1-b2^t"]
        if c["eps_root"] is not None:
            v_hat = v_hat + c["eps_root"]
        direction = m_hat / (jnp.sqrt(v_hat) + c["eps"])
        return direction, m, v

    return moments


def adam_family_step(grads, state: AdamState, params, moments, finish=None, mask=None):
    """One update of an optimizer whose state is an [`AdamState`][].

    Per leaf, in the compute dtype: `moments(g, m, v, t) -> (direction, m, v)` with
    `t` the 1-based step number, then `finish(direction, g, p, selected) -> update`
    (`selected` is the leaf's `mask` entry, `None` without a mask). Buffers are stored
    back in their own dtype and updates returned in the param's.
    """
    count = increment(state.count)
    step_number = per_dtype(lambda dtype: count.astype(dtype))

    def _leaf(g, m, v, p, selected):
        dtype = compute_dtype(g.dtype, m.dtype, v.dtype)
        direction, m32, v32 = moments(
            g.astype(dtype), m.astype(dtype), v.astype(dtype), step_number(dtype)
        )
        update = direction if finish is None else finish(direction, g, p, selected)
        return pack(
            update.astype(out_dtype(g, p)), m32.astype(m.dtype), v32.astype(v.dtype)
        )

    updates, mu, nu = tree_map_unzip(
        _leaf,
        3,
        grads,
        state.mu,
        state.nu,
        params,
        mask,
        names=("grads", "state.mu", "state.nu", "params", "mask"),
    )
    return updates, AdamState(count, mu, nu)


def is_zero(value) -> bool:
    """Whether a hyperparameter is a concrete zero (so its term can be skipped)."""
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
    )


def add_decay(d: Array, p: Array | None, weight_decay, selected) -> Array:
    r"""$d + \lambda p$ on a selected leaf (decoupled weight decay, before the lr)."""
    if selected is False or is_zero(weight_decay):
        return d
    if p is None:
        raise ValueError("eqxopt: weight decay needs `params` in `update`.")
    return d + scalar(weight_decay, d.dtype) * p.astype(d.dtype)


def descent(learning_rate, weight_decay=0.0):
    r"""A `finish` for [`adam_family_step`][]: $-\eta\,(d + \lambda p)$, the weight
    decay on the leaves the mask selects. `learning_rate`, `weight_decay` are already
    resolved (schedules evaluated)."""

    neg_lr = per_dtype(lambda dtype: -scalar(learning_rate, dtype))
    decay = per_dtype(lambda dtype: scalar(weight_decay, dtype))

    def finish(d, g, p, selected):
        if not (selected is False or is_zero(weight_decay)):
            if p is None:
                raise ValueError("eqxopt: weight decay needs `params` in `update`.")
            d = d + decay(d.dtype) * p.astype(d.dtype)
        return d * neg_lr(d.dtype)

    return finish


def _adam(opt, grads, state: AdamState, params, leaf_update=None, mask=None):
    r"""Shared Adam step. `leaf_update(direction, g, p, m)` maps the bias-corrected
    direction $\hat m / (\sqrt{\hat v + \epsilon_{root}} + \epsilon)$ (in the
    compute dtype) to the update."""
    moments = adam_moments(opt.b1, opt.b2, opt.eps, opt.eps_root, opt.nesterov)
    return adam_family_step(grads, state, params, moments, leaf_update, mask)


class ScaleByAdam(AbstractOptimizer[AdamState]):
    r"""Adam's preconditioning without the learning rate: the update is the
    bias-corrected $\hat m / (\sqrt{\hat v + \epsilon_{\rm root}} + \epsilon)$.
    Matches `optax.scale_by_adam`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByAdam(b1=0.9, b2=0.999), eqxopt.ScaleByLearningRate(1e-3)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # the same updates as eqxopt.Adam(1e-3)
        ```
    """

    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 0.0
    state_dtype: object = eqx.field(default=None, static=True)
    nesterov: bool = eqx.field(default=False, static=True, kw_only=True)

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _init(self, params)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        return _adam(self, grads, state, params)


class Adam(AbstractOptimizer[AdamState]):
    r"""Adam: per-coordinate step sizes from running moments of the gradient.

    $$m_k = \beta_1 m_{k-1} + (1-\beta_1) g_k, \qquad
      v_k = \beta_2 v_{k-1} + (1-\beta_2) g_k^2$$

    $$u_k = -\eta_k\, \frac{\hat m_k}{\sqrt{\hat v_k + \epsilon_{\rm root}} + \epsilon},
      \qquad \hat m_k = \frac{m_k}{1-\beta_1^k},\ \hat v_k = \frac{v_k}{1-\beta_2^k}$$

    Defaults and `nesterov` (NAdam-style look-ahead) follow `optax.adam`; `state_dtype`
    (Optax's `mu_dtype`) sets the dtype of both moments.

    ??? cite "References"

        ```bibtex
        @inproceedings{kingma2015adam,
            title={Adam: A Method for Stochastic Optimization},
            author={Kingma, Diederik P. and Ba, Jimmy},
            booktitle={ICLR}, year={2015}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Adam(eqxopt.schedules.CosineDecay(1e-3, decay_steps=1000))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 0.0
    state_dtype: object = eqx.field(default=None, static=True)
    nesterov: bool = eqx.field(default=False, static=True, kw_only=True)

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _init(self, params)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)
        return _adam(self, grads, state, params, descent(lr))


class AdamW(AbstractOptimizer[AdamState]):
    r"""Adam with decoupled weight decay.

    $$u_k = -\eta_k \left( \frac{\hat m_k}{\sqrt{\hat v_k + \epsilon_{\rm root}}
      + \epsilon} + \lambda\, p_k \right)$$

    with $m, v$ as in [`eqxopt.Adam`][]; the decay applies only to the leaves `mask`
    selects (a filter spec: a PyTree prefix of the params with bools, or a per-leaf
    callable such as `lambda p: p.ndim > 1`). Defaults follow `optax.adamw`
    (`weight_decay=1e-4`).

    ??? cite "References"

        ```bibtex
        @inproceedings{loshchilov2019decoupled,
            title={Decoupled Weight Decay Regularization},
            author={Loshchilov, Ilya and Hutter, Frank},
            booktitle={ICLR}, year={2019}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.AdamW(1e-3, weight_decay=0.1, mask=lambda p: p.ndim > 1)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # "w" (a matrix) is decayed, the bias "b" is not
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.999
    eps: ScalarLike = 1e-8
    eps_root: ScalarLike = 0.0
    state_dtype: object = eqx.field(default=None, static=True)
    weight_decay: ScalarOrSchedule = 1e-4
    mask: FilterSpec | None = mask_field(default=None)
    nesterov: bool = eqx.field(default=False, static=True, kw_only=True)

    def __check_init__(self):
        _check(self)

    def init(self, params: Params) -> AdamState:
        return _init(self, params)

    def update(self, grads: Updates, state: AdamState, params=None, **extra):
        if params is None:
            raise ValueError("`AdamW.update` needs `params` for the weight decay.")
        lr = resolve(self.learning_rate, state.count)
        wd = resolve(self.weight_decay, state.count)

        mask = decay_mask(self.mask, params)
        return _adam(self, grads, state, params, descent(lr, wd), mask)


_ARGS = r"""- `learning_rate`: $\eta$; a number, an array, or a schedule.
- `b1`, `b2`: decay rates $\beta_1, \beta_2$ of the moments, in `[0, 1)`.
- `eps`, `eps_root`: $\epsilon$ outside and $\epsilon_{\rm root}$ inside the root.
- `state_dtype`: dtype of both moment buffers (Optax's `mu_dtype`); default the
    param's. (Static.)
"""
Adam.__init__.__doc__ = (
    "**Arguments:**\n\n"
    + _ARGS
    + ("- `nesterov`: use Nesterov momentum (NAdam-style). (Static, keyword-only.)\n")
)
AdamW.__init__.__doc__ = (
    "**Arguments:**\n\n"
    + _ARGS
    + (
        "- `weight_decay`: $\\lambda$, a number or a schedule; default `1e-4`.\n"
        "- `mask`: which leaves are decayed, as a filter spec; default all.\n"
        "- `nesterov`: use Nesterov momentum (NAdam-style). (Static, keyword-only.)\n"
    )
)
