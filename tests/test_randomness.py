"""Randomness in optimizer state: typed keys, and per-leaf draws that match drawing
each leaf alone."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import eqxopt
from eqxopt._core.base import describe


def test_key_states_hold_a_typed_key():
    params = {"w": jnp.ones((2, 3))}
    states = [
        eqxopt.DifferentiallyPrivateAggregate(1.0, 1.0, key=3).init(params),
        eqxopt.DPSGD(0.1, 1.0, 1.0, 3).init(params).aggregate_state,
        eqxopt.Sophia(0.1).init(params).hessian_fn_state,
    ]
    for state in states:
        assert jnp.issubdtype(state.key.dtype, jax.dtypes.prng_key)
        assert describe(state.key) == "key<fry>[]"
        assert describe(state.key_data) == "int32[2]"


@pytest.mark.parametrize(
    "sample", [jr.normal, jr.rademacher], ids=["normal", "rademacher"]
)
def test_per_leaf_draws_are_one_call_per_leaf(sample):
    """The per-leaf noise of Kron, AddNoise, DifferentiallyPrivateAggregate and
    Sophia's Hutchinson probes comes from `draws_per_leaf`: same-shape leaves share
    one `vmap`-ed sampler, and every leaf gets what its own key draws alone."""
    from eqxopt._misc import draws_per_leaf

    specs = [((4, 3), jnp.float32), ((5,), jnp.float64), ((4, 3), jnp.float32)]
    specs += [((4, 3), jnp.float64), ((5,), jnp.float64), ((), jnp.float32)]
    keys = jr.split(jr.key(3), len(specs))
    want = [sample(k, shape, dtype) for k, (shape, dtype) in zip(keys, specs)]
    for got in (
        draws_per_leaf(sample, keys, specs),
        jax.jit(lambda keys: draws_per_leaf(sample, keys, specs))(keys),
    ):
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
