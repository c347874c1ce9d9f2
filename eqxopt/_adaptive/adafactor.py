"""Adafactor (and its building block `ScaleByFactoredRms`)."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, Inexact, Int32, PyTree

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
    per_dtype,
    resolve,
    scalar,
    tree_map_unzip,
    typechecked,
    zero_count,
    zeros_like_leaf,
)
from .._quantized import buffers_like, dtype_of, plain_dtype, read, Stored, write


@typechecked
class AdafactorState(eqx.Module):
    """State of [`eqxopt.Adafactor`][] and [`eqxopt.ScaleByFactoredRms`][].

    - `count`: the number of updates applied.
    - `v_row`, `v_col`: the factored second moment of each leaf that is factored (its
      row and column statistics: the leaf's shape without its largest, resp. second
      largest, axis), `None` for the other leaves.
    - `v`: the full second moment of each leaf that is not factored, `None` for the
      factored ones.
    - `momentum`: the momentum buffer, one leaf per param (`None` without momentum;
      it may be quantized: [`eqxopt.Quantized`][]).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        opt = eqxopt.Adafactor(1e-2, min_dim_size_to_factor=2)
        state = opt.init({"w": jnp.ones((4, 3)), "b": jnp.zeros(3)})
        assert state.v_row["w"].shape == (3,) and state.v_col["w"].shape == (4,)
        assert state.v["w"] is None  # 3 + 4 numbers stand for the 4 x 3 moment
        assert state.v["b"].shape == (3,)  # a vector is not factored
        ```
    """

    count: Int32[Array, ""]
    v_row: PyTree[Inexact[Array, "..."]]
    v_col: PyTree[Inexact[Array, "..."]]
    v: PyTree[Inexact[Array, "..."]]
    momentum: PyTree[Stored] | None


def _factored_dims(shape, factored: bool, min_dim_size_to_factor: int):
    """The (second largest, largest) axes of `shape` if both are at least
    `min_dim_size_to_factor` long, else `None`; ties resolved as Optax does."""
    if not factored or len(shape) < 2:
        return None
    order = np.argsort(shape)
    if shape[order[-2]] < min_dim_size_to_factor:
        return None
    return int(order[-2]), int(order[-1])


def _init(params, factored, min_dim, state_dtype, momentum) -> AdafactorState:
    def _leaf(p):
        # The second moments mirror no param (but an unfactored one): a dtype only.
        dtype = plain_dtype(state_dtype) or p.dtype
        dims = _factored_dims(p.shape, factored, min_dim)
        if dims is None:
            return pack(None, None, zeros_like_leaf(p, dtype))
        d1, d0 = dims
        row = tuple(s for i, s in enumerate(p.shape) if i != d0)
        col = tuple(s for i, s in enumerate(p.shape) if i != d1)
        return pack(jnp.zeros(row, dtype), jnp.zeros(col, dtype), None)

    v_row, v_col, v = tree_map_unzip(_leaf, 3, params, names=("params",))
    if momentum is not None:
        momentum = buffers_like(params, state_dtype, "momentum", False)
    return AdafactorState(zero_count(), v_row, v_col, v, momentum)


def _decay_rate_pow(t: Array, exponent) -> Array:
    """Adafactor's second-moment decay $\\hat\\beta_{2,t} = 1 - t^{-c}$ ($t$ from 1)."""
    return 1 - t ** -scalar(exponent, t.dtype)


def _factored_rms(g32, v_row, v_col, v, rho, one_minus_rho, eps, dims):
    """One step of the factored (or, with `dims=None`, full) second moment, in the
    compute dtype: returns (g / sqrt(v_hat), v_row, v_col, v)."""
    g2 = abs_sq(g32) + eps
    if dims is None:
        v = rho * v + one_minus_rho * g2
        return g32 * jax.lax.rsqrt(v), None, None, v
    d1, d0 = dims
    v_row = rho * v_row + one_minus_rho * jnp.mean(g2, axis=d0)
    v_col = rho * v_col + one_minus_rho * jnp.mean(g2, axis=d1)
    reduced_d1 = d1 - 1 if d1 > d0 else d1
    row_col_mean = jnp.mean(v_row, axis=reduced_d1, keepdims=True)
    row_factor = jax.lax.rsqrt(v_row / row_col_mean)
    col_factor = jax.lax.rsqrt(v_col)
    update = (
        g32 * jnp.expand_dims(row_factor, axis=d0) * jnp.expand_dims(col_factor, d1)
    )
    return update, v_row, v_col, None


def _rms(x: Array) -> Array:
    return jnp.sqrt(jnp.mean(abs_sq(x)))


def _cast(x, like):
    return None if like is None else write(x, like)


def _adafactor_step(
    grads,
    state: AdafactorState,
    params,
    *,
    factored: bool,
    min_dim: int,
    decay_rate,
    decay_rate_fn,
    step_offset,
    eps,
    finish=None,
    mask=None,
):
    """The factored-RMS scaling of every leaf, then `finish(u, g, p, m, selected) ->
    (update, m)` (all in the compute dtype)."""
    count = state.count

    def _constants(dtype):
        if decay_rate_fn is None:
            # In float32 whatever the params' dtype, as Optax (a scalar per step).
            t = count.astype(jnp.float32) - scalar(step_offset, jnp.float32) + 1
            rho = _decay_rate_pow(t, decay_rate).astype(dtype)
        else:
            rho = jnp.asarray(decay_rate_fn(count - step_offset, decay_rate), dtype)
        return rho, 1 - rho, scalar(eps, dtype)

    constants = per_dtype(_constants)  # traced once per update, not once per leaf

    def _leaf(g, v_row, v_col, v, m, p, selected):
        dtypes = [dtype_of(x) for x in (g, v_row, v_col, v, m, p) if x is not None]
        dtype = compute_dtype(*dtypes)
        dims = _factored_dims(g.shape, factored, min_dim)
        u, new_row, new_col, new_v = _factored_rms(
            g.astype(dtype),
            None if v_row is None else v_row.astype(dtype),
            None if v_col is None else v_col.astype(dtype),
            None if v is None else v.astype(dtype),
            *constants(dtype),
            dims=dims,
        )
        new_m = None
        if finish is not None:
            u, new_m = finish(u, g, p, None if m is None else read(m, dtype), selected)
        return pack(
            u.astype(out_dtype(g, p)),
            _cast(new_row, v_row),
            _cast(new_col, v_col),
            _cast(new_v, v),
            _cast(new_m, m),
        )

    updates, v_row, v_col, v, momentum = tree_map_unzip(
        _leaf,
        5,
        grads,
        state.v_row,
        state.v_col,
        state.v,
        state.momentum,
        params,
        mask,
        names=(  # the factored statistics do not mirror the params' shapes
            "grads",
            "v_row",
            "v_col",
            "v",
            "state.momentum",
            "params",
            "mask",
        ),
    )
    momentum = None if state.momentum is None else momentum
    return updates, AdafactorState(increment(count), v_row, v_col, v, momentum)


class ScaleByFactoredRms(AbstractOptimizer[AdafactorState]):
    r"""Divide updates by a factored estimate of their root mean square (Adafactor's
    preconditioning, without clipping, learning rate or sign).

    For a leaf whose two largest axes are both at least `min_dim_size_to_factor` long,
    with $G = g^2 + \epsilon$ and means over those axes,

    $$R_k = \hat\beta_{2,k} R_{k-1} + (1-\hat\beta_{2,k})\,\operatorname{mean}_{\rm
      col}(G), \qquad C_k = \hat\beta_{2,k} C_{k-1} + (1-\hat\beta_{2,k})\,
      \operatorname{mean}_{\rm row}(G)$$

    $$u_k = g_k \Big/ \sqrt{R_k C_k / \operatorname{mean}(R_k)}$$

    and for every other leaf the unfactored $v_k = \hat\beta_{2,k} v_{k-1} +
    (1-\hat\beta_{2,k})\,G$, $u_k = g_k / \sqrt{v_k}$. The decay is
    $\hat\beta_{2,k} = 1 - (k + 1 - k_0)^{-c}$ with $c$ = `decay_rate` and $k_0$ =
    `step_offset`, or `decay_rate_fn(k - k_0, decay_rate)`. Matches
    `optax.scale_by_factored_rms`.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.ScaleByFactoredRms(min_dim_size_to_factor=2),
            eqxopt.ScaleByLearningRate(1e-2),
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        assert state[0].v["w"] is None  # "w" keeps v_row and v_col only
        ```
    """

    factored: bool = eqx.field(default=True, static=True)
    decay_rate: ScalarLike = 0.8
    step_offset: ScalarLike = 0
    min_dim_size_to_factor: int = eqx.field(default=128, static=True)
    epsilon: ScalarLike = 1e-30
    decay_rate_fn: Callable | None = eqx.field(default=None, static=True)
    state_dtype: DTypeLike | None = eqx.field(default=None, static=True, kw_only=True)

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("decay_rate", "epsilon"),
            positive_int=("min_dim_size_to_factor",),
        )

    def init(self, params: Params) -> AdafactorState:
        return _init(
            params, self.factored, self.min_dim_size_to_factor, self.state_dtype, None
        )

    def update(self, grads: Updates, state: AdafactorState, params=None, **extra):
        return _adafactor_step(
            grads,
            state,
            params,
            factored=self.factored,
            min_dim=self.min_dim_size_to_factor,
            decay_rate=self.decay_rate,
            decay_rate_fn=self.decay_rate_fn,
            step_offset=self.step_offset,
            eps=self.epsilon,
        )


class Adafactor(AbstractOptimizer[AdafactorState]):
    r"""Adafactor: Adam-like steps with a factored second moment (memory sublinear in
    the size of each matrix), update clipping, and steps relative to the parameters'
    scale.

    Per param leaf, with $s_k = g_k / \sqrt{\hat v_k}$ the factored-RMS scaling of
    [`eqxopt.ScaleByFactoredRms`][] (factored for leaves whose two largest axes are
    both at least `min_dim_size_to_factor` long, unfactored otherwise):

    $$\tilde s_k = s_k \big/ \max\!\big(1, \operatorname{RMS}(s_k)/d\big), \qquad
      a_k = \eta_k\,\max\!\big(\epsilon_2, \operatorname{RMS}(p_k)\big)\,\tilde s_k$$

    $$m_k = \beta_1 m_{k-1} + (1-\beta_1)\,a_k \ \text{(optional)}, \qquad
      u_k = -\big(m_k + \lambda\,p_k\big)$$

    with $d$ = `clipping_threshold` (`None`: no clipping), $\epsilon_2 = 10^{-3}$,
    the parameter scale only with `multiply_by_parameter_scale`, and $\eta = 1$ when
    `learning_rate` is `None`. The paper's relative step size $\rho_k = \min(10^{-2},
    1/\sqrt{k})$ is the schedule in the example below, with
    `multiply_by_parameter_scale=True` (the default).

    Matches `optax.adafactor`, except that `state_dtype` (default: the param's dtype)
    replaces `dtype_momentum` (default float32 in Optax) and applies to every buffer,
    and the second moments are not padded with size-1 placeholders: a factored leaf has
    `v=None`, an unfactored one `v_row=v_col=None`.

    ??? cite "References"

        ```bibtex
        @inproceedings{shazeer2018adafactor,
            title={Adafactor: Adaptive Learning Rates with Sublinear Memory Cost},
            author={Shazeer, Noam and Stern, Mitchell},
            booktitle={ICML}, year={2018}}
        ```

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt


        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}


        def relative_step(count):  # min(1e-2, 1/sqrt(k)), k = count + 1
            return jnp.minimum(1e-2, jax.lax.rsqrt(count.astype(jnp.float32) + 1))


        opt = eqxopt.Adafactor(relative_step, min_dim_size_to_factor=2)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule | None = None
    min_dim_size_to_factor: int = eqx.field(default=128, static=True)
    decay_rate: ScalarLike = 0.8
    decay_offset: ScalarLike = 0
    multiply_by_parameter_scale: bool = eqx.field(default=True, static=True)
    clipping_threshold: ScalarLike | None = 1.0
    momentum: ScalarLike | None = None
    state_dtype: object = eqx.field(default=None, static=True)
    weight_decay_rate: ScalarOrSchedule | None = None
    eps: ScalarLike = 1e-30
    factored: bool = eqx.field(default=True, static=True)
    weight_decay_mask: FilterSpec | None = mask_field(default=None)

    def _param_buffers(self) -> dict[str, bool]:
        return {} if self.momentum is None else {"momentum": False}

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=(
                "learning_rate",
                "decay_rate",
                "weight_decay_rate",
                "eps",
            ),
            positive=("clipping_threshold",),
            unit_interval=("momentum",),
            positive_int=("min_dim_size_to_factor",),
        )

    def init(self, params: Params) -> AdafactorState:
        return _init(
            params,
            self.factored,
            self.min_dim_size_to_factor,
            self.state_dtype,
            self.momentum,
        )

    def update(self, grads: Updates, state: AdafactorState, params=None, **extra):
        need_params(self, params)
        lr = None
        if self.learning_rate is not None:
            lr = resolve(self.learning_rate, state.count)
        wd = None
        if self.weight_decay_rate is not None:
            wd = resolve(self.weight_decay_rate, state.count)

        def _constants(dtype):
            def cast(x):
                return None if x is None else scalar(x, dtype)

            beta = cast(self.momentum)
            return (
                cast(self.clipping_threshold),
                cast(lr),
                scalar(1e-3, dtype),
                beta,
                None if beta is None else 1 - beta,
                cast(wd),
            )

        constants = per_dtype(_constants)  # traced once per update, not per leaf

        def finish(u, g, p, m, selected):
            threshold, lr_, floor, beta, one_minus_beta, wd_ = constants(u.dtype)
            if threshold is not None:
                u = u / jnp.maximum(1, _rms(u) / threshold)
            if lr_ is not None:
                u = u * lr_
            if self.multiply_by_parameter_scale:
                p_rms = _rms(p.astype(u.dtype))
                u = u * jnp.where(p_rms <= floor, floor, p_rms)
            if m is not None:
                u = m = one_minus_beta * u + beta * m
            if wd_ is not None and selected is not False:
                u = u + wd_ * p.astype(u.dtype)
            return -u, m

        mask = decay_mask(self.weight_decay_mask, params)
        return _adafactor_step(
            grads,
            state,
            params,
            factored=self.factored,
            min_dim=self.min_dim_size_to_factor,
            decay_rate=self.decay_rate,
            decay_rate_fn=None,
            step_offset=self.decay_offset,
            eps=self.eps,
            finish=finish,
            mask=mask,
        )


Adafactor.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, a schedule, or `None` (default) for
    $\eta = 1$ (steps relative to the parameter scale only).
- `min_dim_size_to_factor`: factor a leaf's second moment only if its two largest
    axes are at least this long; default `128`. (Static.)
- `decay_rate`: the exponent $c$ of the decay $\hat\beta_{2,k} = 1 - k^{-c}$.
- `decay_offset`: the step at which the decay schedule starts (for fine-tuning).
- `multiply_by_parameter_scale`: scale steps by $\max(10^{-3},
    \operatorname{RMS}(p))$. (Static.)
- `clipping_threshold`: $d$, clip each leaf's scaled update to RMS $\le d$; `None`
    disables clipping.
- `momentum`: $\beta_1$ in `[0, 1)`, or `None` (default) for no momentum buffer.
- `state_dtype`: dtype of every buffer; default the param's (Optax's
    `dtype_momentum`, which defaults to float32 and sets only the momentum). An
    [`eqxopt.Quantized`][] (or a dict `{"momentum": ...}`) quantizes the momentum;
    the second moments then keep the param's dtype. (Static.)
- `weight_decay_rate`: $\lambda$; a number, a schedule, or `None` for none. Not
    multiplied by the learning rate.
- `eps`: $\epsilon$, added to the squared gradients.
- `factored`: whether to factor second moments at all. (Static.)
- `weight_decay_mask`: which leaves are decayed, as a filter spec; default all.
"""
ScaleByFactoredRms.__init__.__doc__ = r"""**Arguments:**

- `factored`: whether to factor second moments at all. (Static.)
- `decay_rate`: the exponent $c$ of the decay $\hat\beta_{2,k} = 1 - k^{-c}$.
- `step_offset`: $k_0$, the step at which the decay schedule starts.
- `min_dim_size_to_factor`: factor a leaf's second moment only if its two largest
    axes are at least this long; default `128`. (Static.)
- `epsilon`: $\epsilon$, added to the squared gradients.
- `decay_rate_fn`: `(step, decay_rate) -> decay`, replacing the default
    $1 - (\text{step} + 1)^{-c}$. (Static.)
- `state_dtype`: dtype of every buffer; default the param's. (Static, keyword-only.)
"""
