"""Adaptive gradient clipping (unit-wise, relative to the parameter norm)."""

import equinox as eqx
import jax.numpy as jnp

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer, EmptyState
from .._custom_types import Params, ScalarLike, Updates
from .._misc import (
    abs_sq,
    compute_dtype,
    out_dtype,
    scalar,
    tree_map,
)


def _unit_axes(x, axis) -> tuple[int, ...]:
    if x.ndim == 0:
        return ()
    if axis is not None:
        return (axis,) if isinstance(axis, int) else tuple(axis)
    if x.ndim == 1:
        return (0,)
    return tuple(range(1, x.ndim))


def _unitwise_norm(x, axes):
    return jnp.sqrt(jnp.sum(abs_sq(x), axis=axes, keepdims=True))


class AdaptiveGradClip(AbstractOptimizer[EmptyState]):
    r"""Adaptive gradient clipping (AGC): clip each unit's update to at most
    `clipping` times the norm of that unit's parameters.

    $$u_i \mapsto \begin{cases} u_i & \|u_i\| < \lambda \max(\|p_i\|, \epsilon) \\
      \lambda \max(\|p_i\|, \epsilon)\, u_i / \|u_i\| & \text{otherwise}\end{cases}$$

    A *unit* is one output unit. By default this uses Equinox's `(out, in, ...)`
    layout: for a leaf of rank 2 or more the norms are taken over every axis but the
    first (a row of a `Linear` weight, an output channel of a `Conv` kernel), as in
    the paper and in PyTorch implementations; vectors and scalars are one unit.
    `axis` overrides the reduction axes for every leaf of rank >= 1.

    Optax's `adaptive_grad_clip` assumes Flax's `(in, out)` layout by default (it
    reduces over axis 0 of a matrix and axes 0-2 of a 4-D kernel), so on Equinox
    weights the two defaults differ; with the same `axis` they agree.

    ??? cite "References"

        ```bibtex
        @inproceedings{brock2021high,
            title={High-Performance Large-Scale Image Recognition Without
                Normalization},
            author={Brock, Andrew and De, Soham and Smith, Samuel L. and
                Simonyan, Karen},
            booktitle={ICML}, year={2021}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(eqxopt.AdaptiveGradClip(0.01), eqxopt.SGD(0.1, 0.9))
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    clipping: ScalarLike
    eps: ScalarLike = 1e-3
    axis: int | tuple[int, ...] | None = eqx.field(default=None, static=True)

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("clipping", "eps"))
        if not (
            self.axis is None
            or isinstance(self.axis, int)
            or (
                isinstance(self.axis, tuple)
                and all(isinstance(a, int) for a in self.axis)
            )
        ):
            raise ValueError(
                "`AdaptiveGradClip(axis=...)` must be None, an int or a tuple of ints, "
                f"got {self.axis!r}."
            )

    def init(self, params: Params) -> EmptyState:
        return EmptyState()

    def update(self, grads: Updates, state: EmptyState, params=None, **extra):
        need_params(self, params)

        def _leaf(g, p):
            dtype = compute_dtype(g.dtype, p.dtype)
            g32, p32 = g.astype(dtype), p.astype(dtype)
            axes = _unit_axes(g, self.axis)
            g_norm = _unitwise_norm(g32, axes)
            p_norm = _unitwise_norm(p32, axes)
            max_norm = scalar(self.clipping, dtype) * jnp.maximum(
                p_norm, scalar(self.eps, dtype)
            )
            clipped = g32 * (max_norm / jnp.maximum(g_norm, scalar(1e-6, dtype)))
            return jnp.where(g_norm < max_norm, g32, clipped).astype(out_dtype(g, p))

        return tree_map(_leaf, grads, params, names=("grads", "params")), state


AdaptiveGradClip.__init__.__doc__ = r"""**Arguments:**

- `clipping`: $\lambda$, the largest allowed ratio of a unit's update norm to its
    parameter norm.
- `eps`: $\epsilon$, a floor on the parameter norm, so zero-initialised units still
    move; default `1e-3`.
- `axis`: the reduction axes of every leaf of rank >= 1 (an int or a tuple), or
    `None` (default) for Equinox's layout: all axes but the first. (Static.)
"""
