r"""The per-leaf arithmetic that optimizer families share (moving averages, bias
corrections, the adaptive step, decoupled weight decay, the descent step).

A kernel takes arrays already cast to the compute dtype, and scalars already cast to
it: callers compute their scalars once per update and dtype with
`eqxopt._misc.per_dtype` (the one per-update cache of the package), so a kernel
adds no casts and no scalar work per leaf. A term whose hyperparameter is a concrete
zero is left out of the trace (see `is_zero`).
"""

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike

from ._checks import need_params
from ._custom_types import ScalarLike
from ._filter_spec import decay_mask
from ._misc import (
    abs_sq,
    compute_dtype,
    full_like_leaf,
    per_dtype,
    resolve,
    scalar,
    tree_map,
)
from ._quantized import dtype_of, read, write


def is_zero(value) -> bool:
    """Whether a hyperparameter is a concrete zero (so its term can be skipped)."""
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
    )


def full_like(params, value, dtype=None):
    """`value` at every optimized leaf, in `dtype` or else the leaf's own dtype."""
    return tree_map(lambda p: full_like_leaf(p, value, dtype or p.dtype), params)


# --- two moving averages (the Adam family) -------------------------------------------


class Betas(NamedTuple):
    r"""The scalars of a two-moment rule at step $t$, in the compute dtype:
    $\beta_1, 1-\beta_1, \beta_2, 1-\beta_2$, the bias corrections $1-\beta_1^t$,
    $1-\beta_2^t$, and (for Nesterov's look-ahead only, else `None`)
    $1-\beta_1^{t+1}$."""

    b1: Array
    one_minus_b1: Array
    b2: Array
    one_minus_b2: Array
    correction1: Array
    correction2: Array
    correction1_next: Array | None


def betas(b1, b2, t: Array, nesterov: bool = False) -> Betas:
    """`Betas` at the 1-based step number `t` (a scalar of the compute dtype)."""
    d1, d2 = scalar(b1, t.dtype), scalar(b2, t.dtype)
    next_ = 1 - d1 ** (t + 1) if nesterov else None
    return Betas(d1, 1 - d1, d2, 1 - d2, 1 - d1**t, 1 - d2**t, next_)


def optional(value, dtype) -> Array | None:
    """A hyperparameter as a scalar of `dtype`, or `None` when it is a concrete zero
    (for a term that `adaptive` then leaves out)."""
    return None if is_zero(value) else scalar(value, dtype)


def ema(x: Array, m: Array, decay: Array, one_minus_decay: Array) -> Array:
    r"""One step of an exponential moving average: $(1 - d)\,x + d\,m$."""
    return one_minus_decay * x + decay * m


def first_moment_hat(m: Array, g: Array, c: Betas) -> Array:
    r"""The bias-corrected first moment $m / (1 - \beta_1^t)$, or with
    `c.correction1_next` Nesterov's look-ahead (NAdam, as Optax):
    $\beta_1 m / (1 - \beta_1^{t+1}) + (1 - \beta_1)\,g / (1 - \beta_1^t)$."""
    if c.correction1_next is None:
        return m / c.correction1
    return c.b1 * (m / c.correction1_next) + c.one_minus_b1 * (g / c.correction1)


def adaptive(m_hat: Array, v_hat: Array, eps: Array, eps_root: Array | None) -> Array:
    r"""Adam's step $\hat m / (\sqrt{\hat v + \epsilon_{\rm root}} + \epsilon)$
    ($\epsilon_{\rm root}$ left out when `None`)."""
    if eps_root is not None:
        v_hat = v_hat + eps_root
    return m_hat / (jnp.sqrt(v_hat) + eps)


# --- the step: learning rate and decoupled weight decay ------------------------------


def add_decay(d: Array, p: Array | None, weight_decay, selected) -> Array:
    r"""$d + \lambda p$ on a selected leaf (decoupled weight decay, before the lr)."""
    if selected is False or is_zero(weight_decay):
        return d
    if p is None:
        raise ValueError("eqxopt: weight decay needs `params` in `update`.")
    return d + scalar(weight_decay, d.dtype) * p.astype(d.dtype)


def descent(learning_rate: ArrayLike, weight_decay: ArrayLike = 0.0):
    r"""A `finish(d, g, p, selected)` (see `adam_family_step`): $-\eta\,(d + \lambda
    p)$, the weight decay on the leaves the mask selects (`selected` is not `False`).
    `learning_rate`, `weight_decay` are already resolved (schedules evaluated)."""

    neg_lr = per_dtype(lambda dtype: -scalar(learning_rate, dtype))
    decay = per_dtype(lambda dtype: scalar(weight_decay, dtype))

    def finish(d, g, p, selected):
        if not (selected is False or is_zero(weight_decay)):
            if p is None:
                raise ValueError("eqxopt: weight decay needs `params` in `update`.")
            d = d + decay(d.dtype) * p.astype(d.dtype)
        return d * neg_lr(d.dtype)

    return finish


def descent_of(opt, count: Array, params):
    r"""`(finish, mask)` for an optimizer of a family, read from the fields it declares:
    with `learning_rate` the update is $-\eta\,d$; with `weight_decay` and `mask` as
    well, $-\eta\,(d + \lambda p)$ on the leaves `mask` selects (then `params` are
    required); with neither (the `ScaleBy*` blocks) it is the direction $d$ itself,
    `(None, None)`. Schedules are evaluated at `count`."""
    learning_rate = getattr(opt, "learning_rate", None)
    if learning_rate is None:
        return None, None
    lr = resolve(learning_rate, count)
    if not hasattr(opt, "weight_decay"):
        return descent(lr), None
    need_params(opt, params, "for the weight decay")
    wd = resolve(opt.weight_decay, count)
    return descent(lr, wd), decay_mask(opt.mask, params)


def momentum_step(g, t, decay, nesterov: bool):
    """Heavy-ball momentum on one leaf, as `optax.trace`: returns (direction, trace).

    `t` is `None` when there is no momentum. Arithmetic runs in at least float32.
    """
    dtype = compute_dtype(g.dtype, *(() if t is None else (dtype_of(t),)))
    g = g.astype(dtype)
    if t is None:
        return g, None
    d = scalar(decay, dtype)
    new_t = g + d * read(t, dtype)
    direction = g + d * new_t if nesterov else new_t
    return direction, write(new_t, t)


def _norm_at_least(x: Array, min_norm: ScalarLike) -> Array:
    """$\\max(\\|x\\|_2, n_{\\min})$ (as `optax.safe_norm`, forward)."""
    norm = jnp.sqrt(jnp.sum(abs_sq(x)))
    floor = scalar(min_norm, norm.dtype)
    return jnp.where(norm <= floor, floor, norm)


def trust_ratio(
    u: Array,
    p: Array,
    min_norm: ScalarLike = 0.0,
    coefficient: ScalarLike = 1.0,
    eps: ScalarLike = 0.0,
) -> Array:
    """$u \\cdot c\\,\\|p\\| / (\\|u\\| + \\epsilon)$, or $u$ where either norm is 0
    (both norms floored at `min_norm`). `u` is in the compute dtype."""
    p_norm = _norm_at_least(p.astype(u.dtype), min_norm)
    u_norm = _norm_at_least(u, min_norm)
    ratio = scalar(coefficient, u.dtype) * p_norm / (u_norm + scalar(eps, u.dtype))
    ratio = jnp.where((p_norm == 0) | (u_norm == 0), jnp.ones_like(ratio), ratio)
    return u * ratio
