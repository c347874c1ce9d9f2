"""MARS (MARS-AdamW): variance-reduced Adam with a scaled gradient correction."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Int32, PyTree

from .._checks import check_hyperparams, need_params
from .._core.base import AbstractOptimizer
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._kernels import is_zero
from .._misc import (
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
class MARSState(eqx.Module):
    """State of [`eqxopt.MARS`][]: the step count, the first and second moments
    `exp_avg`, `exp_avg_sq`, and the previous step's gradient `last_grad` (one leaf
    per param each, possibly quantized: [`eqxopt.Quantized`][]; the names are the
    reference's).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.MARS(3e-3)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert jnp.array_equal(state.last_grad["w"], grads["w"])
        ```
    """

    count: Int32[Array, ""]
    exp_avg: PyTree[Stored]
    exp_avg_sq: PyTree[Stored]
    last_grad: PyTree[Stored]


# The buffers, and whether each is non-negative.
_BUFFERS = {"exp_avg": False, "exp_avg_sq": True, "last_grad": False}


class MARS(AbstractOptimizer[MARSState]):
    r"""MARS-AdamW (Yuan et al. 2024): AdamW on a variance-reduced gradient.

    For a 2-D leaf (a weight matrix), with $g_{k-1}$ the previous step's gradient
    ($0$ at the first step),

    $$c_k = g_k + \gamma\,\frac{\beta_1}{1-\beta_1}\,(g_k - g_{k-1}), \qquad
      c_k \leftarrow \frac{c_k}{\max(1, \|c_k\|_F)}$$

    $$m_k = \beta_1 m_{k-1} + (1-\beta_1) c_k, \qquad
      v_k = \beta_2 v_{k-1} + (1-\beta_2) c_k^2$$

    $$u_k = -\eta_k \left(\lambda p_k + \frac{m_k}{\big(\sqrt{v_k / (1-\beta_2^k)}
      + \epsilon\big)(1-\beta_1^k)}\right).$$

    Other leaves (vectors, scalars, convolution kernels: everything that is not
    2-D, as in the reference) get plain AdamW on $g_k$ with `lr_1d`, `b1_1d`, `b2_1d`
    and `weight_decay_1d`, unless `optimize_1d=True`, which gives them the MARS
    update with the main hyperparameters. Defaults are the reference's
    (`github.com/AGI-Arena/MARS`, `MARS/optimizers/mars.py`,
    `mars_type="mars-adamw"`, the approximate `is_approx=True` form, which takes the
    previous gradient from the previous step).

    **Differences from the reference.**

    - The reference scales its 1-D learning rate with the main one's schedule
      (`lr_t * lr_1d / lr_0`); here `lr_1d` is its own number or schedule, so a
      schedule that starts at 0 is allowed.
    - Only MARS-AdamW: the reference's `mars_type="mars-lion"` / `"mars-shampoo"`,
      `amsgrad` and the exact (`is_approx=False`) variant are not implemented.

    ??? cite "References"

        ```bibtex
        @article{yuan2024mars,
            title={MARS: Unleashing the Power of Variance Reduction for Training
                Large Models},
            author={Yuan, Huizhuo and Liu, Yifeng and Wu, Shuang and Zhou, Xun and
                Gu, Quanquan},
            journal={arXiv:2411.10438}, year={2024}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.MARS(3e-3, weight_decay=0.1)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.95
    b2: ScalarLike = 0.99
    gamma: ScalarLike = 0.025
    eps: ScalarLike = 1e-8
    weight_decay: ScalarLike = 0.0
    optimize_1d: bool = eqx.field(default=False, static=True)
    lr_1d: ScalarOrSchedule = 3e-3
    b1_1d: ScalarLike = 0.9
    b2_1d: ScalarLike = 0.95
    weight_decay_1d: ScalarLike = 0.1
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = _BUFFERS

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=(
                "learning_rate",
                "gamma",
                "eps",
                "weight_decay",
                "lr_1d",
                "weight_decay_1d",
            ),
            unit_interval=("b1", "b2", "b1_1d", "b2_1d"),
        )

    def init(self, params: Params) -> MARSState:
        buffers = (buffers_like(params, self.state_dtype, *b) for b in _BUFFERS.items())
        return MARSState(zero_count(), *buffers)

    def update(self, grads: Updates, state: MARSState, params=None, **extra):
        if not (is_zero(self.weight_decay) and is_zero(self.weight_decay_1d)):
            need_params(self, params, "for the weight decay")
        count = increment(state.count)
        lr = resolve(self.learning_rate, state.count)
        lr_1d = resolve(self.lr_1d, state.count)

        def _leaf(g, m, v, last, p):
            dtype = compute_dtype(g.dtype, *map(dtype_of, (m, v, last)))
            g32 = g.astype(dtype)
            t = count.astype(dtype)
            mars = self.optimize_1d or g.ndim == 2
            if mars:
                b1, b2 = scalar(self.b1, dtype), scalar(self.b2, dtype)
                eta, wd = scalar(lr, dtype), scalar(self.weight_decay, dtype)
                gamma = scalar(self.gamma, dtype)
                c = g32 + (gamma * (b1 / (1 - b1))) * (g32 - read(last, dtype))
                norm = jnp.sqrt(jnp.sum(c * c))
                c = jnp.where(norm > 1, c / norm, c)
            else:
                b1, b2 = scalar(self.b1_1d, dtype), scalar(self.b2_1d, dtype)
                eta, wd = scalar(lr_1d, dtype), scalar(self.weight_decay_1d, dtype)
                c = g32
            m32 = b1 * read(m, dtype) + (1 - b1) * c
            v32 = b2 * read(v, dtype) + (1 - b2) * c * c
            bc1, bc2 = 1 - b1**t, 1 - b2**t
            denom = (jnp.sqrt(v32) / jnp.sqrt(bc2) + scalar(self.eps, dtype)) * bc1
            direction = m32 / denom
            if p is not None:
                direction = direction + wd * p.astype(dtype)
            u = (-eta * direction).astype(out_dtype(g, p))
            # (`last` is split like the moments under `shard_over`; so is its copy.)
            g_last = write(sharded_like(g, last), last)
            return pack(u, write(m32, m), write(v32, v), g_last)

        updates, exp_avg, exp_avg_sq, last_grad = tree_map_unzip(
            _leaf,
            4,
            grads,
            state.exp_avg,
            state.exp_avg_sq,
            state.last_grad,
            params,
            names=(
                "grads",
                "state.exp_avg",
                "state.exp_avg_sq",
                "state.last_grad",
                "params",
            ),
        )
        return updates, MARSState(count, exp_avg, exp_avg_sq, last_grad)


MARS.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`.
- `b1`, `b2`: decay rates of the moments of the 2-D leaves, in `[0, 1)`; defaults
    `0.95`, `0.99` (the reference's `betas`).
- `gamma`: $\gamma$, the strength of the gradient correction; default `0.025`.
- `eps`: added to the root of the bias-corrected second moment.
- `weight_decay`: $\lambda$ of the 2-D leaves (multiplied by the learning rate).
- `optimize_1d`: also give the other leaves the MARS update, with the main
    hyperparameters. (Static.)
- `lr_1d`, `b1_1d`, `b2_1d`, `weight_decay_1d`: the AdamW hyperparameters of the
    leaves that are not 2-D (the reference's `lr_1d`, `betas_1d`, `weight_decay_1d`).
- `state_dtype`: dtype of the three buffers; default the param's. An
    [`eqxopt.Quantized`][] quantizes them, a dict keyed by `"exp_avg"`, `"exp_avg_sq"`
    and `"last_grad"` each. (Static.)

Weight decay needs `params` in `update`.
"""
