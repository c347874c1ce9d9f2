"""Gradient noise: `AddNoise` and `NoisySGD`."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Int32, Key

from .._checks import check_hyperparams
from .._core.base import AbstractOptimizer, scalar_hyperparams
from .._custom_types import Params, ScalarLike, ScalarOrSchedule, Updates
from .._misc import (
    compute_dtype,
    draws_per_leaf,
    increment,
    is_none,
    is_param,
    out_dtype,
    resolve,
    scalar,
    typechecked,
    zero_count,
)
from .._random import check_key, pack_key, unpack_key


@typechecked
class AddNoiseState(eqx.Module):
    """State of [`eqxopt.AddNoise`][] and [`eqxopt.NoisySGD`][]: the step count and
    the PRNG key the next update splits.

    The key is stored as its raw key data, bit-cast to `int32` (`key_data`), together
    with the name of its PRNG implementation (`impl`, static), so that the state
    serialises with `eqx.tree_serialise_leaves` and holds only int32 and float leaves;
    `state.key` gives it back as a typed key array.

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        state = eqxopt.NoisySGD(1e-2, key=42).init(params)
        state.count, state.key_data  # the step count, the PRNG key as int32 data
        state.impl  # the key's implementation (static), e.g. "threefry2x32"
        ```
    """

    count: Int32[Array, ""]
    key_data: Int32[Array, "..."]
    impl: str = eqx.field(static=True)

    @property
    def key(self) -> Key[Array, ""]:
        """The PRNG key, as a typed key array (`jax.random.key`)."""
        return unpack_key(self.key_data, self.impl)


def _init_state(key: Any) -> AddNoiseState:
    if key is None:
        key = 0
    if isinstance(key, (int, np.integer)):
        key = jr.key(int(key))
    elif not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jr.wrap_key_data(jnp.asarray(key, jnp.uint32))
    data, impl = pack_key(key)
    return AddNoiseState(zero_count(), data, impl)


def _noisy(opt, grads, state: AddNoiseState, params, lr):
    """Add annealed Gaussian noise (as `optax.add_noise`), then scale by `-lr`."""
    count = increment(state.count)
    new_key, sample_key = jr.split(state.key)
    leaves, treedef = jtu.tree_flatten(grads, is_leaf=is_none)
    param_leaves = (
        [None] * len(leaves)
        if params is None
        else jtu.tree_leaves(params, is_leaf=is_none)
    )
    if len(param_leaves) != len(leaves):
        raise ValueError(
            f"`{type(opt).__name__}.update`: `grads` and `params` must have the same "
            "tree structure."
        )
    specs = [(g.shape, compute_dtype(g.dtype)) for g in leaves if is_param(g)]
    noises = iter(draws_per_leaf(jr.normal, jr.split(sample_key, len(specs)), specs))
    out = []
    for g, p in zip(leaves, param_leaves):
        if not is_param(g):
            out.append(None)
            continue
        dtype = compute_dtype(g.dtype)
        t = count.astype(dtype)
        std = jnp.sqrt(scalar(opt.eta, dtype) / t ** scalar(opt.gamma, dtype))
        noise = next(noises)
        u = g.astype(dtype) + std * noise
        if lr is not None:
            u = u * -scalar(lr, dtype)
        out.append(u.astype(out_dtype(g, p if is_param(p) else None)))
    updates = jtu.tree_unflatten(treedef, out)
    data, impl = pack_key(new_key)
    return updates, AddNoiseState(count, data, impl)


class AddNoise(AbstractOptimizer[AddNoiseState]):
    r"""Add annealed Gaussian noise to the updates.

    $$u_k = g_k + \sigma_k\,\xi_k, \qquad \xi_k \sim \mathcal N(0, I), \qquad
      \sigma_k^2 = \frac{\eta}{(k+1)^\gamma}$$

    Matches `optax.add_noise`, with the same key usage: with the same `key`, the noise
    is bit-for-bit the one Optax draws (for float32 and float64 updates; lower
    precision updates draw their noise in float32). The key lives in the state, so
    runs are reproducible and checkpoints resume exactly.

    ??? cite "References"

        ```bibtex
        @article{neelakantan2015adding,
            title={Adding Gradient Noise Improves Learning for Very Deep Networks},
            author={Neelakantan, Arvind and Vilnis, Luke and Le, Quoc V. and
                Sutskever, Ilya and Kaiser, Lukasz and Kurach, Karol and
                Martens, James},
            journal={arXiv preprint arXiv:1511.06807}, year={2015}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.Chain(
            eqxopt.AddNoise(eta=0.01, gamma=0.55, key=0),
            eqxopt.ScaleByLearningRate(0.1),
        )
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        # noise of variance eta / (1 + k)^gamma is added to the grads
        ```
    """

    eta: ScalarLike
    gamma: ScalarLike
    key: Any = None

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("eta", "gamma"))
        check_key(self)

    def init(self, params: Params) -> AddNoiseState:
        return _init_state(self.key)

    def update(self, grads: Updates, state: AddNoiseState, params=None, **extra):
        return _noisy(self, grads, state, params, None)

    def hyperparams(self, state: AddNoiseState) -> dict[str, Any]:
        hp = scalar_hyperparams(self, state.count)
        hp.pop("key", None)
        return hp


class NoisySGD(AbstractOptimizer[AddNoiseState]):
    r"""SGD on gradients with added, annealed Gaussian noise.

    $$u_k = -\eta_k\,\bigl(g_k + \sigma_k\,\xi_k\bigr), \qquad
      \xi_k \sim \mathcal N(0, I), \qquad \sigma_k^2 = \frac{\eta}{(k+1)^\gamma}$$

    ($\eta_k$ is `learning_rate`, $\eta$ is `eta`.) Matches `optax.noisy_sgd` bit for
    bit in the noise it draws, given the same `key` (an int seed or a
    `jax.random.key`; `None` means seed 0). The key is carried in the state
    ([`eqxopt.AddNoiseState`][]), so a run is reproducible and resumes exactly from a
    checkpoint.

    ??? cite "References"

        ```bibtex
        @article{neelakantan2015adding,
            title={Adding Gradient Noise Improves Learning for Very Deep Networks},
            author={Neelakantan, Arvind and Vilnis, Luke and Le, Quoc V. and
                Sutskever, Ilya and Kaiser, Lukasz and Kurach, Karol and
                Martens, James},
            journal={arXiv preprint arXiv:1511.06807}, year={2015}}
        ```

    !!! Example

        ```python
        import jax.numpy as jnp

        import eqxopt

        params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -1.0, 0.0])}
        opt = eqxopt.NoisySGD(1e-2, eta=0.01, gamma=0.55, key=42)
        state = opt.init(params)
        params, state = opt.step(params, grads, state)
        ```
    """

    learning_rate: ScalarOrSchedule
    eta: ScalarLike = 0.01
    gamma: ScalarLike = 0.55
    key: Any = None

    def __check_init__(self):
        check_hyperparams(self, nonnegative=("learning_rate", "eta", "gamma"))
        check_key(self)

    def init(self, params: Params) -> AddNoiseState:
        return _init_state(self.key)

    def update(self, grads: Updates, state: AddNoiseState, params=None, **extra):
        lr = resolve(self.learning_rate, state.count)
        return _noisy(self, grads, state, params, lr)

    def hyperparams(self, state: AddNoiseState) -> dict[str, Any]:
        hp = scalar_hyperparams(self, state.count)
        hp.pop("key", None)
        return hp


_KEY_DOC = (
    "- `key`: an int seed or a `jax.random.key` (typed key array); `None` means seed "
    "0. Pass an int to keep the optimizer free of JAX arrays (and serialisable).\n"
)
AddNoise.__init__.__doc__ = (
    "**Arguments:**\n\n"
    "- `eta`: base variance $\\eta$ of the noise.\n"
    "- `gamma`: decay exponent $\\gamma$ of the variance.\n" + _KEY_DOC
)
NoisySGD.__init__.__doc__ = (
    "**Arguments:**\n\n"
    "- `learning_rate`: $\\eta_k$; a number, an array, or a schedule.\n"
    "- `eta`: base variance of the noise; default `0.01`.\n"
    "- `gamma`: decay exponent of the variance; default `0.55`.\n" + _KEY_DOC
)
