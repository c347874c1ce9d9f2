"""Differentially private SGD: `DifferentiallyPrivateAggregate` and `DPSGD`."""

from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Int32, Key

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer, child_update, scalar_hyperparams
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    abs_sq,
    compute_dtype,
    draws_per_leaf,
    is_none,
    is_param,
    out_dtype,
    real_dtype,
    scalar,
    typechecked,
)
from .._random import check_key, pack_key, unpack_key
from .sgd import SGD, SGDState


@typechecked
class DifferentiallyPrivateAggregateState(eqx.Module):
    """State of [`eqxopt.DifferentiallyPrivateAggregate`][]: the PRNG key the next
    update splits.

    As in [`eqxopt.AddNoiseState`][], the key is stored as its raw key data bit-cast
    to `int32` (`key_data`) with the name of its implementation (`impl`, static), so
    that the state serialises with `eqx.tree_serialise_leaves`; `state.key` gives it
    back as a typed key array (`jax.random.key`).

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.DifferentiallyPrivateAggregate(1.0, 0.5, key=42).init(params)
        assert jnp.array_equal(
            jax.random.key_data(state.key), jax.random.key_data(jax.random.key(42))
        )
        ```
    """

    key_data: Int32[Array, "..."]
    impl: str = eqx.field(static=True)

    @property
    def key(self) -> Key[Array, ""]:
        """The PRNG key, as a typed key array (`jax.random.key`)."""
        return unpack_key(self.key_data, self.impl)


def _initial_key(key: Any) -> DifferentiallyPrivateAggregateState:
    """Optax's seeding: an int `n` is `jax.random.key(n)`; a typed key is kept; a
    legacy raw `uint32` key is wrapped (the same bits)."""
    if key is None:
        key = 0
    if isinstance(key, (int, np.integer)):
        key = jr.key(int(key))
    elif not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jr.wrap_key_data(jnp.asarray(key, jnp.uint32))
    data, impl = pack_key(key)
    return DifferentiallyPrivateAggregateState(data, impl)


def _aggregate(opt, grads, state: DifferentiallyPrivateAggregateState, params):
    """Clip each example's gradient to global norm `l2_norm_clip`, sum over the batch
    axis, add Gaussian noise of std `l2_norm_clip * noise_multiplier`, divide by the
    batch size. The keys are split as `optax.contrib.differentially_private_aggregate`
    splits them, so a given seed gives Optax's noise."""
    leaves, treedef = jtu.tree_flatten(grads, is_leaf=is_none)
    param_leaves = (
        [None] * len(leaves)
        if params is None
        else jtu.tree_leaves(params, is_leaf=is_none)
    )
    if len(param_leaves) != len(leaves):
        raise ValueError(
            f"`{type(opt).__name__}.update`: `grads` and `params` must have the same "
            "tree structure (with a leading batch axis on every gradient)."
        )
    arrays = [g for g in leaves if is_param(g)]
    if not arrays:
        return grads, state
    if any(g.ndim == 0 for g in arrays):
        raise ValueError(
            f"`{type(opt).__name__}.update` expects per-example gradients, with a "
            "batch axis first on every leaf (e.g. from `jax.vmap(jax.grad(loss))`), "
            "but got a scalar leaf."
        )
    batch = arrays[0].shape[0]
    if any(g.shape[0] != batch for g in arrays):
        raise ValueError(
            f"`{type(opt).__name__}.update`: every gradient leaf must have the same "
            f"batch size on axis 0, got {[g.shape[0] for g in arrays]}."
        )
    dtype = compute_dtype(*(g.dtype for g in arrays))
    real = real_dtype(dtype)
    clip = scalar(opt.l2_norm_clip, real)
    std = clip * scalar(opt.noise_multiplier, real)
    # Per-example global norms (over all leaves), as `optax.tree.norm` under `vmap`;
    # a complex entry counts as two real ones.
    sq = sum(
        jnp.sum(abs_sq(g.astype(dtype)).reshape(batch, -1), axis=1) for g in arrays
    )
    norms = jnp.sqrt(sq)
    multipliers = jnp.nan_to_num(jnp.minimum(clip / norms, 1), nan=1.0)
    split = jr.split(state.key, len(arrays) + 1)
    new_key = split[0]
    specs = [(g.shape[1:], compute_dtype(g.dtype)) for g in arrays]
    noises = iter(draws_per_leaf(jr.normal, split[1:], specs))
    out = []
    for g, p in zip(leaves, param_leaves):
        if not is_param(g):
            out.append(None)
            continue
        ldt = compute_dtype(g.dtype)
        clipped = jnp.tensordot(multipliers.astype(ldt), g.astype(ldt), axes=1)
        noise = next(noises)
        if jnp.iscomplexobj(noise):
            # JAX's complex normal has E|z|^2 = 1; the real and imaginary parts each
            # need the full standard deviation.
            noise = noise * scalar(np.sqrt(2.0), real_dtype(ldt))
        u = (clipped + std.astype(ldt) * noise) / jnp.asarray(batch, ldt)
        out.append(u.astype(out_dtype(g, p if is_param(p) else None)))
    data, impl = pack_key(new_key)
    return jtu.tree_unflatten(treedef, out), DifferentiallyPrivateAggregateState(
        data, impl
    )


class DifferentiallyPrivateAggregate(
    AbstractOptimizer[DifferentiallyPrivateAggregateState]
):
    r"""Aggregate per-example gradients the DP-SGD way (Abadi et al. 2016): clip each
    example's gradient to global L2 norm $C$, sum over the batch, add Gaussian noise
    and average.

    $$u = \frac{1}{B}\Big(\sum_{i=1}^{B} g_i \min\big(1, C / \|g_i\|\big)
      + \sigma C\,\xi\Big), \qquad \xi \sim \mathcal N(0, I)$$

    ($C$ = `l2_norm_clip`, $\sigma$ = `noise_multiplier`.) The gradients must carry a
    batch axis first on every leaf (per-example gradients, e.g. from
    `jax.vmap(jax.grad(loss), in_axes=(None, 0))`); the updates have the params'
    shapes. Put it first in a [`eqxopt.Chain`][]; gradient accumulation
    ([`eqxopt.MultiSteps`][]) does not compose with it.

    The noise comes from a PRNG key in the state, split once per update exactly as
    `optax.contrib.differentially_private_aggregate` splits it, so a given `key`
    reproduces Optax's updates. A complex entry counts as two real ones: its
    $|g|^2$ enters the norm, and its real and imaginary parts each get noise of
    standard deviation $\sigma C$ (Optax's draws JAX's complex normal, which gives
    each part $\sigma C / \sqrt 2$: less noise than the clipping bound calls for).

    ??? cite "References"

        ```bibtex
        @inproceedings{abadi2016deep,
            title={Deep Learning with Differential Privacy},
            author={Abadi, Martin and Chu, Andy and Goodfellow, Ian and McMahan,
                H. Brendan and Mironov, Ilya and Talwar, Kunal and Zhang, Li},
            booktitle={ACM CCS}, year={2016}}
        ```

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        per_example = jax.tree.map(lambda p: jnp.stack([p, -p, 2 * p]), params)
        opt = eqxopt.DifferentiallyPrivateAggregate(1.0, 0.5, key=0)
        state = opt.init(params)
        noisy_mean, state = opt.update(per_example, state, params)
        assert noisy_mean["w"].shape == (2, 3)  # the batch axis is gone
        ```
    """

    l2_norm_clip: ScalarLike
    noise_multiplier: ScalarLike
    key: Any = None

    # `grads` carry a batch axis that `params` lack: exempt from the check that they
    # have the params' shapes.
    _per_example_grads: ClassVar[bool] = True

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("l2_norm_clip", "noise_multiplier"))
        check_key(self)

    def init(self, params: Params) -> DifferentiallyPrivateAggregateState:
        return _initial_key(self.key)

    def update(
        self,
        grads: Updates,
        state: DifferentiallyPrivateAggregateState,
        params=None,
        **extra,
    ):
        return _aggregate(self, grads, state, params)


DifferentiallyPrivateAggregate.__init__.__doc__ = r"""**Arguments:**

- `l2_norm_clip`: $C \ge 0$, the largest L2 norm (over all leaves) of one example's
    gradient.
- `noise_multiplier`: $\sigma \ge 0$, the noise's standard deviation relative to $C$.
- `key`: an int seed (`jax.random.key(key)`, as Optax) or a `jax.random.key`;
    default `0`, Optax's default.
"""


@typechecked
class DPSGDState(eqx.Module):
    """State of [`eqxopt.DPSGD`][]: the aggregation's PRNG key and the SGD state (step
    count and momentum).

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        opt = eqxopt.DPSGD(1e-2, 1.0, 0.5, seed=0, momentum=0.9)
        state = opt.init(params)
        state.aggregate_state.key  # a typed PRNG key
        state.sgd_state.trace["w"]  # the momentum
        ```
    """

    aggregate_state: DifferentiallyPrivateAggregateState
    sgd_state: SGDState


class DPSGD(AbstractOptimizer[DPSGDState]):
    r"""DP-SGD: [`eqxopt.DifferentiallyPrivateAggregate`][] followed by SGD with
    optional (Nesterov) momentum.

    $$\bar g_k = \frac{1}{B}\Big(\sum_{i} g_{k,i} \min\big(1, C/\|g_{k,i}\|\big)
      + \sigma C\,\xi_k\Big), \qquad t_k = \bar g_k + \mu\,t_{k-1}, \qquad
      u_k = -\eta_k\,t_k$$

    `update` takes per-example gradients (a batch axis first on every leaf) and
    returns updates in the params' shapes. Matches `optax.contrib.dpsgd` (the same
    noise for the same `seed`).

    ??? cite "References"

        ```bibtex
        @inproceedings{abadi2016deep,
            title={Deep Learning with Differential Privacy},
            author={Abadi, Martin and Chu, Andy and Goodfellow, Ian and McMahan,
                H. Brendan and Mironov, Ilya and Talwar, Kunal and Zhang, Li},
            booktitle={ACM CCS}, year={2016}}
        ```

    !!! Example

        ```python
        import jax
        import jax.numpy as jnp

        import eqxopt


        def loss(params, x):
            return jnp.sum((params["w"] @ x + params["b"]) ** 2)


        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(2)}
        xs = jnp.arange(12.0).reshape(4, 3)  # a batch of 4 examples
        per_example = jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, xs)
        opt = eqxopt.DPSGD(1e-2, l2_norm_clip=1.0, noise_multiplier=1.1, seed=0)
        state = opt.init(params)
        params, state = opt.step(params, per_example, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    l2_norm_clip: ScalarLike
    noise_multiplier: ScalarLike
    seed: int = eqx.field(static=True)
    momentum: ScalarLike | None = None
    nesterov: bool = eqx.field(default=False, static=True)

    _per_example_grads: ClassVar[bool] = True

    def __check_init__(self):
        check_hyperparams(
            self,
            nonnegative=("learning_rate", "l2_norm_clip", "noise_multiplier"),
        )
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
            raise ValueError(f"`DPSGD(seed=...)` must be an int, got {self.seed!r}.")

    def _aggregator(self) -> DifferentiallyPrivateAggregate:
        return DifferentiallyPrivateAggregate(
            self.l2_norm_clip, self.noise_multiplier, key=int(self.seed)
        )

    def _sgd(self) -> SGD:
        return SGD(self.learning_rate, self.momentum, self.nesterov)

    def init(self, params: Params) -> DPSGDState:
        return DPSGDState(self._aggregator().init(params), self._sgd().init(params))

    def update(self, grads: Updates, state: DPSGDState, params=None, **extra):
        grads, aggregate_state = child_update(
            self._aggregator(), ".aggregate_state", grads, state.aggregate_state, params
        )
        updates, sgd_state = child_update(
            self._sgd(), ".sgd_state", grads, state.sgd_state, params
        )
        return updates, DPSGDState(aggregate_state, sgd_state)

    def hyperparams(self, state: DPSGDState) -> dict[str, Any]:
        return scalar_hyperparams(self, state.sgd_state.count)


DPSGD.__init__.__doc__ = r"""**Arguments:**

- `learning_rate`: $\eta$; a number, an array, or a schedule `count -> scalar`.
- `l2_norm_clip`: $C \ge 0$, the largest L2 norm (over all leaves) of one example's
    gradient.
- `noise_multiplier`: $\sigma \ge 0$, the noise's standard deviation relative to $C$.
- `seed`: the int seed of the noise's PRNG key (`jax.random.key(seed)`, as Optax).
    (Static.)
- `momentum`: $\mu$, or `None` (default) for no momentum.
- `nesterov`: use Nesterov momentum. (Static.)
"""
