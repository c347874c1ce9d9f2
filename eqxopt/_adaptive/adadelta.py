"""Adadelta (and its `ScaleByAdadelta` building block)."""

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
    tree_map_unzip,
    typechecked,
    zero_count,
)
from .._quantized import buffers_like, dtype_of, read, Stored, write


@typechecked
class AdadeltaState(eqx.Module):
    """State of [`eqxopt.Adadelta`][] and [`eqxopt.ScaleByAdadelta`][]: the step
    count and the running averages of the squared gradients (`e_g`) and of the squared
    updates (`e_x`), one leaf per param (each may be quantized:
    [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.Adadelta().init(params)
        state.e_g["w"]  # running average of the squared gradients
        state.e_x["w"]  # running average of the squared updates
        ```
    """

    count: Int32[Array, ""]
    e_g: PyTree[Stored]
    e_x: PyTree[Stored]


def _adadelta(opt, grads, state: AdadeltaState, params, lr, wd, mask):
    """One Adadelta step. `lr` is `None` for the bare direction (no sign flip)."""

    def _leaf(g, e_g, e_x, p, selected):
        dtype = compute_dtype(g.dtype, dtype_of(e_g), dtype_of(e_x))
        g32 = g.astype(dtype)
        if wd is not None and selected is not False:
            g32 = g32 + scalar(wd, dtype) * p.astype(dtype)
        rho, eps = scalar(opt.rho, dtype), scalar(opt.eps, dtype)
        e_x_old = read(e_x, dtype)
        e_g32 = (1 - rho) * abs_sq(g32) + rho * read(e_g, dtype)
        u = jnp.sqrt(e_x_old + eps) / jnp.sqrt(e_g32 + eps) * g32
        e_x32 = (1 - rho) * abs_sq(u) + rho * e_x_old
        if lr is not None:
            u = u * -scalar(lr, dtype)
        return pack(u.astype(out_dtype(g, p)), write(e_g32, e_g), write(e_x32, e_x))

    updates, e_g, e_x = tree_map_unzip(
        _leaf,
        3,
        grads,
        state.e_g,
        state.e_x,
        params,
        mask,
        names=("grads", "state.e_g", "state.e_x", "params", "weight_decay_mask"),
    )
    return updates, AdadeltaState(increment(state.count), e_g, e_x)


def _init(opt, params) -> AdadeltaState:
    return AdadeltaState(
        zero_count(),
        buffers_like(params, opt.state_dtype, "e_g", True),
        buffers_like(params, opt.state_dtype, "e_x", True),
    )


class ScaleByAdadelta(AbstractOptimizer[AdadeltaState]):
    r"""Adadelta's rescaling without learning rate or sign flip:
    $u = \sqrt{E[\Delta x^2] + \epsilon}\,/\,\sqrt{E[g^2] + \epsilon}\; g$.
    Matches `optax.scale_by_adadelta`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByAdadelta(rho=0.9), eqxopt.ScaleByLearningRate(1.0)
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    rho: ScalarLike = 0.9
    eps: ScalarLike = 1e-6
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = {"e_g": True, "e_x": True}

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("eps",), unit_interval=("rho",))

    def init(self, params: Params) -> AdadeltaState:
        return _init(self, params)

    def update(self, grads: Updates, state: AdadeltaState, params=None, **extra):
        return _adadelta(self, grads, state, params, None, None, None)


class Adadelta(AbstractOptimizer[AdadeltaState]):
    r"""Adadelta: step sizes from running averages of squared gradients and of squared
    updates, so that the update has the units of the parameters.

    $$E[g^2]_k = \rho\,E[g^2]_{k-1} + (1-\rho)\,g_k^2$$

    $$\Delta x_k = \frac{\sqrt{E[\Delta x^2]_{k-1} + \epsilon}}
      {\sqrt{E[g^2]_k + \epsilon}}\, g_k, \qquad
      E[\Delta x^2]_k = \rho\,E[\Delta x^2]_{k-1} + (1-\rho)\,\Delta x_k^2$$

    $$u_k = -\eta_k\,\Delta x_k$$

    where $g_k$ includes the coupled weight decay $\lambda p_k$ on the leaves
    `weight_decay_mask` selects. Matches `optax.adadelta`, except for
    `learning_rate=None`: here it means the paper's rule ($\eta = 1$, a descent step),
    whereas Optax then returns the direction without flipping its sign.

    ??? cite "References"

        ```bibtex
        @article{zeiler2012adadelta,
            title={{ADADELTA}: An Adaptive Learning Rate Method},
            author={Zeiler, Matthew D.},
            journal={arXiv preprint arXiv:1212.5701}, year={2012}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Adadelta(learning_rate=1.0, rho=0.95)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule | None = None
    rho: ScalarLike = 0.9
    eps: ScalarLike = 1e-6
    weight_decay: ScalarOrSchedule = 0.0
    weight_decay_mask: FilterSpec | None = mask_field(default=None)
    state_dtype: object = eqx.field(default=None, static=True)

    _state_buffers = {"e_g": True, "e_x": True}

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "eps", "weight_decay"),
            unit_interval=("rho",),
        )

    def init(self, params: Params) -> AdadeltaState:
        return _init(self, params)

    def update(self, grads: Updates, state: AdadeltaState, params=None, **extra):
        lr = (
            1.0
            if self.learning_rate is None
            else resolve(self.learning_rate, state.count)
        )
        wd = resolve(self.weight_decay, state.count)
        if isinstance(wd, (int, float)) and wd == 0:
            wd, mask = None, None
        else:
            need_params(self, params, "for weight decay")
            mask = decay_mask(self.weight_decay_mask, params)
        return _adadelta(self, grads, state, params, lr, wd, mask)


Adadelta.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule. `None` (default) means
    $\eta = 1$, the paper's rule.
- `rho`: decay rate $\rho$ of both running averages, in `[0, 1)`.
- `eps`: $\epsilon$, added inside both square roots.
- `weight_decay`: coupled weight decay $\lambda$ (added to the gradient), a number or
    a schedule; default `0`.
- `weight_decay_mask`: which leaves are decayed, as a filter spec; default all.
- `state_dtype`: dtype of both running averages; default the param's. An
    [`eqxopt.Quantized`][] quantizes them, a dict keyed by `"e_g"` and `"e_x"` each.
    (Static.)
"""
ScaleByAdadelta.__init__.__doc__ = r"""**Arguments:**

- `rho`: decay rate of both running averages, in `[0, 1)`.
- `eps`: added inside both square roots.
- `state_dtype`: dtype of both running averages; default the param's. An
    [`eqxopt.Quantized`][] quantizes them, a dict keyed by `"e_g"` and `"e_x"` each.
    (Static.)
"""
