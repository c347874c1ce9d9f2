"""ADOPT: Adam with the second moment of the *previous* step, which converges for any
`b2`."""

from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    abs_sq,
    clip_magnitude,
    compute_dtype,
    increment,
    out_dtype,
    pack,
    real_dtype,
    resolve,
    scalar,
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, read, Stored, write


def quarter_power(count: Array) -> Array:
    """ADOPT's default clipping bound, $k^{1/4}$ at step $k$ (from 0)."""
    return count**0.25


@typechecked
class ADOPTState(eqx.Module):
    """State of [`eqxopt.ADOPT`][]: the step count and the first (`mu`) and second
    (`nu`) moments, one leaf per param (each may be quantized:
    [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.ADOPT(1e-3)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert state.count == 1 and state.mu["w"].shape == state.nu["w"].shape == (2, 3)
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Stored]
    nu: PyTree[Stored]


class ADOPT(AbstractOptimizer[ADOPTState]):
    r"""ADOPT: normalise the gradient by the second moment of the previous steps
    (so the two are independent), then take momentum.

    $$\tilde g_k = \operatorname{clip}\left(\frac{g_k}{\max(\sqrt{v_{k-1}},
      \epsilon)},\ c_k\right), \qquad m_k = \beta_1 m_{k-1} + (1-\beta_1)\,\tilde g_k$$

    $$v_k = \beta_2 v_{k-1} + (1-\beta_2)\,g_k^2, \qquad u_k = -\eta_k\, m_k$$

    for $k \ge 1$; the first step only sets $v_0 = g_0^2$ (its update is 0). With
    `use_clipping`, $c_k$ = `clip_value_fn(k)` ($k^{1/4}$ by default), else no
    clipping; `nesterov` applies the momentum step once more to the output. Matches
    `optax.contrib.adopt`. `clip_value_fn` is called with the step count as a float
    (in the update's real compute dtype), so it works under any dtype promotion mode.
    For complex params $g_k^2$ is $|g_k|^2$ and the clip bounds the modulus, keeping
    the phase (Optax's raises: complex numbers have no order).

    ??? cite "References"

        ```bibtex
        @inproceedings{taniguchi2024adopt,
            title={{ADOPT}: Modified Adam Can Converge with Any $\beta_2$ with the
                Optimal Rate},
            author={Taniguchi, Shohei and Harada, Keno and Minegishi, Gouki and
                Oshima, Yuta and Jeong, Seong Cheol and Nagahara, Go and Iiyama,
                Tomoshi and Suzuki, Masahiro and Iwasawa, Yusuke and Matsuo, Yutaka},
            booktitle={NeurIPS}, year={2024}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.ADOPT(1e-3, b2=0.9999)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.9
    b2: ScalarLike = 0.9999
    eps: ScalarLike = 1e-6
    state_dtype: object = eqx.field(default=None, static=True)
    nesterov: bool = eqx.field(default=False, static=True, kw_only=True)
    use_clipping: bool = eqx.field(default=True, static=True, kw_only=True)
    clip_value_fn: Callable[[Array], Array] = eqx.field(
        default=quarter_power, static=True, kw_only=True
    )

    _state_buffers = {"mu": False, "nu": True}

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "eps"),
            unit_interval=("b1", "b2"),
        )
        if not callable(self.clip_value_fn):
            raise ValueError(
                "`ADOPT(clip_value_fn=...)` must be a callable `count -> bound`, got "
                f"{self.clip_value_fn!r}."
            )

    def init(self, params: Params) -> ADOPTState:
        return ADOPTState(
            zero_count(),
            buffers_like(params, self.state_dtype, "mu", False),
            buffers_like(params, self.state_dtype, "nu", True),
        )

    def update(self, grads: Updates, state: ADOPTState, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)
        first = state.count == 0

        def _leaf(g, m, v, p):
            dtype = compute_dtype(g.dtype, dtype_of(m), dtype_of(v))
            g32, m32, v32 = g.astype(dtype), read(m, dtype), read(v, dtype)
            one, zero = jnp.ones((), dtype), jnp.zeros((), dtype)
            b1 = jnp.where(first, one, scalar(self.b1, dtype))
            b2 = jnp.where(first, zero, scalar(self.b2, dtype))
            new_v = (1 - b2) * abs_sq(g32) + b2 * v32
            real = real_dtype(dtype)
            # v holds |g|^2 (complex-typed for complex g).
            root = jnp.sqrt(jnp.real(v32))
            normed = g32 / jnp.maximum(root, scalar(self.eps, real)).astype(dtype)
            if self.use_clipping:
                bound = jnp.asarray(self.clip_value_fn(state.count.astype(real)))
                normed = clip_magnitude(normed, bound.astype(real))
            new_m = (1 - b1) * normed + b1 * m32
            out = (1 - b1) * normed + b1 * new_m if self.nesterov else new_m
            u = out * -scalar(lr, dtype)
            return pack(u.astype(out_dtype(g, p)), write(new_m, m), write(new_v, v))

        updates, mu, nu = tree_map_unzip(
            _leaf,
            3,
            grads,
            state.mu,
            state.nu,
            params,
            names=("grads", "state.mu", "state.nu", "params"),
        )
        return updates, ADOPTState(increment(state.count), mu, nu)

    _write_after_params = ("nu",)  # see `AbstractOptimizer.step`


ADOPT.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule.
- `b1`, `b2`: decay rates of the first and second moments, in `[0, 1)`.
- `eps`: lower bound $\epsilon$ on $\sqrt{v}$ in the normalisation.
- `state_dtype`: dtype of both moments (Optax's `mu_dtype`); default the param's.
    An [`eqxopt.Quantized`][] quantizes them, a dict keyed by `"mu"` and `"nu"` each.
    (Static.)
- `nesterov`: Nesterov momentum. (Static, keyword-only.)
- `use_clipping`: clip the normalised gradient to $[-c_k, c_k]$. (Static,
    keyword-only.)
- `clip_value_fn`: $c_k$ as a function of the step count (a float array); default
    $k^{1/4}$. (Static, keyword-only.)
"""
