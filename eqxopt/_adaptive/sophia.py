"""Sophia, and Hutchinson's estimator of the Hessian diagonal it uses by default."""

from typing import Any

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Inexact, Int32, Key, PyTree

from .._checks import check_hyperparams, need_extra, need_params
from .._core.base import AbstractOptimizer, child_update, scalar_hyperparams
from .._custom_types import FilterSpec, Params, ScalarLike, ScalarOrSchedule, Updates
from .._filter_spec import decay_mask
from .._kernels import descent
from .._misc import (
    compute_dtype,
    draws_per_leaf,
    increment,
    is_none,
    is_param,
    mask_field,
    out_dtype,
    pack,
    resolve,
    scalar,
    tree_map,
    tree_map_unzip,
    typechecked,
    zero_count,
    zeros_like,
)
from .._quantized import buffers_like, dtype_of, read, Stored, write
from .._random import pack_key, unpack_key


@typechecked
class HutchinsonState(eqx.Module):
    """State of [`eqxopt.HutchinsonEstimatorDiagHessian`][]: the PRNG key of the next
    probe, stored as `int32` key data with its implementation's name (as
    [`eqxopt.AddNoiseState`][], so that it serialises); `state.key` is the typed key.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.HutchinsonEstimatorDiagHessian().init(params)
        state.key  # jax.random.key(0), Optax's default
        ```
    """

    key_data: Int32[Array, "..."]
    impl: str = eqx.field(static=True)

    @property
    def key(self) -> Key[Array, ""]:
        """The PRNG key, as a typed key array (`jax.random.key`)."""
        return unpack_key(self.key_data, self.impl)


def _key_state(seed: Any) -> HutchinsonState:
    if seed is None:
        seed = 0
    if isinstance(seed, (int, np.integer)):
        key = jr.key(int(seed))
    elif jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
        key = seed
    else:  # a legacy raw key (`jax.random.PRNGKey`): the same bits
        key = jr.wrap_key_data(jnp.asarray(seed, jnp.uint32))
    return HutchinsonState(*pack_key(key))


class HutchinsonEstimatorDiagHessian(AbstractOptimizer[HutchinsonState]):
    r"""Hutchinson's estimate of the Hessian diagonal of `obj_fn` at the params:
    $z \odot (H z)$ for a Rademacher vector $z$ (entries $\pm 1$).

    The incoming updates are ignored; `update` needs `params` and the extra argument
    `obj_fn=` (`params -> scalar loss`). Each update draws a new $z$ from the PRNG key
    in the state, split as `optax.contrib.hutchinson_estimator_diag_hessian` splits
    it, so the same seed gives Optax's probes. The default of
    [`eqxopt.Sophia`][]'s `hessian_diagonal_fn`.

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt


        def loss(params):
            return jnp.sum(3.0 * params["w"] ** 2)  # Hessian diagonal: 6


        params = {"w": jnp.ones((2, 3))}
        opt = eqxopt.HutchinsonEstimatorDiagHessian(random_seed=1)
        state = opt.init(params)
        diag, state = opt.update(params, state, params, obj_fn=loss)
        assert jnp.allclose(diag["w"], 6.0)  # exact for a diagonal Hessian
        ```
    """

    random_seed: Any = None

    def __check_init__(self):
        seed = self.random_seed
        ok = seed is None or (
            isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)
        )
        if isinstance(seed, (jax.Array, np.ndarray)):
            is_key = jnp.issubdtype(seed.dtype, jax.dtypes.prng_key)
            ok = (is_key and seed.shape == ()) or (
                not is_key and seed.dtype == np.uint32
            )
        if not ok:
            raise ValueError(
                "`HutchinsonEstimatorDiagHessian(random_seed=...)` must be an int "
                f"seed or a single `jax.random.key`, got {seed!r}."
            )

    def init(self, params: Params) -> HutchinsonState:
        return _key_state(self.random_seed)

    def update(self, grads: Updates, state: HutchinsonState, params=None, **extra):
        need_params(self, params, "the point at which the Hessian is probed")
        (obj_fn,) = need_extra(self, extra, "obj_fn")
        key, subkey = jr.split(state.key)
        leaves, treedef = jtu.tree_flatten(params, is_leaf=is_none)
        arrays = [p for p in leaves if is_param(p)]
        # Drawn in float32 (as Optax) and cast: +-1 is exact in every dtype.
        draws = iter(
            draws_per_leaf(
                jr.rademacher,
                jr.split(subkey, len(arrays)),
                [(p.shape, jnp.float32) for p in arrays],
            )
        )
        signs = jtu.tree_unflatten(
            treedef,
            [next(draws).astype(p.dtype) if is_param(p) else None for p in leaves],
        )
        hvp = eqx.filter_jvp(eqx.filter_grad(obj_fn), (params,), (signs,))[1]
        product = tree_map(
            lambda z, h: z * h.astype(z.dtype), signs, hvp, names=("params", "hvp")
        )
        return product, HutchinsonState(*pack_key(key))


HutchinsonEstimatorDiagHessian.__init__.__doc__ = r"""**Arguments:**

- `random_seed`: an int seed or a `jax.random.key` (a legacy `jax.random.PRNGKey` is
    taken as the same bits); default `None`, i.e. `jax.random.key(0)` (Optax's
    `PRNGKey(0)`).
"""


@typechecked
class SophiaState(eqx.Module):
    """State of [`eqxopt.Sophia`][]: the step count, the momentum `mu` and the EMA of
    the Hessian-diagonal estimates `nu` (one leaf per param; `mu` may be quantized:
    [`eqxopt.Quantized`][]), and the state of the Hessian-diagonal estimator.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.Sophia(1e-3).init(params)
        state.mu["w"], state.nu["w"]  # momentum, Hessian-diagonal EMA
        state.hessian_fn_state.key  # the Hutchinson probes' PRNG key
        ```
    """

    count: Int32[Array, ""]
    mu: PyTree[Stored]
    nu: PyTree[Inexact[Array, "..."]]
    hessian_fn_state: Any


class Sophia(AbstractOptimizer[SophiaState]):
    r"""Sophia: clipped, Hessian-diagonal-preconditioned momentum (Liu et al. 2023).

    $$m_k = \beta_1 m_{k-1} + (1-\beta_1) g_k, \qquad
      d_k = \operatorname{clip}\!\left(\frac{m_k / (1-\beta_1^k)}
      {\max(\gamma\,h_{k-1}, \epsilon)}, -\rho, \rho\right), \qquad
      u_k = -\eta_k\,(d_k + \lambda\,p_k)$$

    and every `update_interval` steps (the first one included) the Hessian-diagonal
    EMA $h_k = \beta_2 h_{k-1} + (1-\beta_2)\,\hat h_k$ takes a new estimate
    $\hat h_k$ from `hessian_diagonal_fn` (default: Hutchinson's estimator, which
    needs the extra argument `obj_fn=`, the loss as a function of the params only).
    $\rho$ = `clip_threshold` (`None`: no clipping). The weight decay applies to the
    leaves `weight_decay_mask` selects (a filter spec). Matches
    `optax.contrib.sophia` (the same probes for the same seed).

    ??? cite "References"

        ```bibtex
        @inproceedings{liu2024sophia,
            title={Sophia: A Scalable Stochastic Second-order Optimizer for Language
                Model Pre-training},
            author={Liu, Hong and Li, Zhiyuan and Hall, David and Liang, Percy and
                Ma, Tengyu},
            booktitle={ICLR}, year={2024}}
        ```

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt


        def loss(params):
            return jnp.sum(params["w"] ** 2) + jnp.sum((params["b"] - 1) ** 2)


        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        opt = eqxopt.Sophia(1e-2)
        state = opt.init(params)
        obj_fn = jax.tree_util.Partial(loss)
        grads = jax.grad(loss)(params)
        params, state = opt.step(params, grads, state, obj_fn=obj_fn)
        ```
    """

    learning_rate: ScalarOrSchedule
    b1: ScalarLike = 0.965
    b2: ScalarLike = 0.99
    eps: ScalarLike = 1e-8
    weight_decay: ScalarOrSchedule = 1e-4
    weight_decay_mask: FilterSpec | None = mask_field(default=None)
    gamma: ScalarLike = 0.01
    clip_threshold: ScalarLike | None = 1.0
    update_interval: int = eqx.field(default=10, static=True)
    hessian_diagonal_fn: AbstractOptimizer | None = None
    state_dtype: object = eqx.field(default=None, static=True)
    verbose: bool = eqx.field(default=False, static=True)
    print_win_rate_every_n_steps: int = eqx.field(default=0, static=True)

    _state_buffers = {"mu": False}  # (`nu` is in the params' dtypes)

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "eps", "weight_decay", "clip_threshold"),
            positive=("gamma",),
            unit_interval=("b1", "b2"),
            positive_int=("update_interval",),
        )
        fn = self.hessian_diagonal_fn
        if fn is not None and not isinstance(fn, AbstractOptimizer):
            raise ValueError(
                "`Sophia(hessian_diagonal_fn=...)` must be an eqxopt optimizer (e.g. "
                f"`HutchinsonEstimatorDiagHessian()`), got {type(fn).__name__}."
            )

    def _hessian_fn(self) -> AbstractOptimizer:
        if self.hessian_diagonal_fn is None:
            return HutchinsonEstimatorDiagHessian()
        return self.hessian_diagonal_fn

    def init(self, params: Params) -> SophiaState:
        return SophiaState(
            zero_count(),
            buffers_like(params, self.state_dtype, "mu", False),
            zeros_like(params),
            self._hessian_fn().init(params),
        )

    def update(self, grads: Updates, state: SophiaState, params=None, **extra):
        need_params(self, params, "for the Hessian-diagonal estimate")
        count = increment(state.count)
        lr = resolve(self.learning_rate, state.count)
        wd = resolve(self.weight_decay, state.count)
        finish = descent(lr, wd)
        mask = decay_mask(self.weight_decay_mask, params)

        def _leaf(g, m, h, p, selected):
            dtype = compute_dtype(g.dtype, dtype_of(m), h.dtype)
            b1 = scalar(self.b1, dtype)
            m32 = (1 - b1) * g.astype(dtype) + b1 * read(m, dtype)
            m_hat = m32 / (1 - b1 ** count.astype(dtype))
            denom = jnp.maximum(
                scalar(self.gamma, dtype) * h.astype(dtype), scalar(self.eps, dtype)
            )
            d = m_hat / denom
            if self.clip_threshold is not None:
                c = scalar(self.clip_threshold, dtype)
                d = jnp.clip(d, -c, c)
            u = finish(d, g, p, selected)
            return pack(u.astype(out_dtype(g, p)), write(m32, m), d)

        updates, mu, directions = tree_map_unzip(
            _leaf,
            3,
            grads,
            state.mu,
            state.nu,
            params,
            mask,
            names=("grads", "state.mu", "state.nu", "params", "mask"),
        )
        if self.verbose and self.clip_threshold is not None:
            self._print_win_rate(directions, count)

        hessian_fn = self._hessian_fn()

        def _refresh(operand):
            fn_state, nu = operand
            diag, fn_state = child_update(
                hessian_fn, ".hessian_fn_state", grads, fn_state, params, **extra
            )

            def _ema(h, n):
                dtype = compute_dtype(h.dtype, n.dtype)
                b2 = scalar(self.b2, dtype)
                new = (1 - b2) * h.astype(dtype) + b2 * n.astype(dtype)
                return new.astype(n.dtype)

            return fn_state, tree_map(_ema, diag, nu, names=("hessian diag", "nu"))

        refresh = state.count % self.update_interval == 0
        fn_state, nu = lax.cond(
            refresh, _refresh, lambda x: x, (state.hessian_fn_state, state.nu)
        )
        return updates, SophiaState(count, mu, nu, fn_state)

    def _print_win_rate(self, directions, count):
        """Optax's diagnostic: the fraction of entries that were not clipped."""
        c = self.clip_threshold
        assert c is not None
        leaves = [d for d in jtu.tree_leaves(directions) if is_param(d)]
        if not leaves or not self.print_win_rate_every_n_steps:
            return
        kept = sum(jnp.sum(jnp.abs(d) < scalar(c, d.dtype)) for d in leaves)
        rate = kept / sum(d.size for d in leaves)
        lax.cond(
            count % self.print_win_rate_every_n_steps == 0,
            lambda: jax.debug.print("Sophia optimizer win rate: {}", rate),
            lambda: None,
        )

    def hyperparams(self, state: SophiaState) -> dict[str, Any]:
        hp = scalar_hyperparams(self, state.count)
        hp["hessian_diagonal_fn"] = self._hessian_fn().hyperparams(
            state.hessian_fn_state
        )
        return hp


Sophia.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`.
- `b1`: decay rate of the momentum, in `[0, 1)`.
- `b2`: decay rate of the Hessian-diagonal EMA, in `[0, 1)` (effectively
    `1 - (1 - b2) / update_interval` per step).
- `eps`: floor of the denominator $\max(\gamma h, \epsilon)$.
- `weight_decay`: $\lambda$ (multiplied by the learning rate); default `1e-4`.
- `weight_decay_mask`: which leaves are decayed, as a filter spec; default all.
- `gamma`: $\gamma > 0$, the scale of the Hessian diagonal in the denominator.
- `clip_threshold`: $\rho$, the bound of each entry of the preconditioned momentum,
    or `None` for no clipping.
- `update_interval`: steps between Hessian-diagonal estimates. (Static.)
- `hessian_diagonal_fn`: an eqxopt optimizer whose `update(grads, state, params,
    **extra)` returns the Hessian-diagonal estimate; default
    [`eqxopt.HutchinsonEstimatorDiagHessian`][]`()` (needs `obj_fn=`).
- `state_dtype`: dtype of the momentum (Optax's `mu_dtype`); default the param's.
    An [`eqxopt.Quantized`][] (or a dict `{"mu": ...}`) quantizes it. (Static.)
- `verbose`, `print_win_rate_every_n_steps`: print the fraction of unclipped entries
    every `n` steps (`jax.debug.print`); `0` turns it off. (Static.)
"""
