"""Randomness in optimizer state: typed keys, and per-leaf draws that match drawing
each leaf alone."""

import jax
import jax.extend
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


def _count(jaxpr, name: str) -> int:
    """Equations of primitive `name` in `jaxpr` and its sub-jaxprs."""
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == name
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            n += _count(sub, name)
    return n


_SPECS = [
    ((4, 3), jnp.float32),
    ((5,), jnp.float64),
    ((4, 3), jnp.float32),
    ((4, 3), jnp.float64),
    ((1025,), jnp.float32),  # one element into a second chunk of 1,024
    ((), jnp.float32),
    ((7, 300), jnp.bfloat16),  # 16-bit draws
    ((2048,), jnp.float16),
]


@pytest.mark.parametrize(
    "sample", [jr.normal, jr.uniform, jr.rademacher], ids=lambda f: f.__name__
)
@pytest.mark.parametrize("keys", ["threefry", "raw", "rbg", "not partitionable"])
def test_per_leaf_draws_are_what_each_key_draws_alone(sample, keys):
    """The per-leaf noise of Kron, AddNoise, DifferentiallyPrivateAggregate and
    Sophia's Hutchinson probes comes from `draws_per_leaf`: every leaf gets what its
    own key draws alone, bit for bit, under `jit` or not. With threefry keys (typed
    or raw) every leaf's draw comes from one sampler in the program, whatever the
    shapes (one `vmap`-ed call over chunks of the draws, per dtype); otherwise one
    per shape (threefry), or one per leaf (`rbg`, whose `vmap`-ed draws differ from
    its draws alone)."""
    with jax.threefry_partitionable(keys != "not partitionable"):
        _check_draws(sample, keys)


def _check_draws(sample, keys):
    from eqxopt._misc import draws_per_leaf

    impl = "rbg" if keys == "rbg" else "threefry2x32"
    split = jr.split(jr.key(3, impl=impl), len(_SPECS))
    if keys == "raw":
        split = jr.key_data(split)  # `jax.random.PRNGKey`-style uint32 keys
    want = [sample(k, shape, dtype) for k, (shape, dtype) in zip(split, _SPECS)]
    draw = lambda keys: draws_per_leaf(sample, keys, _SPECS)
    for got in (draw(split), jax.jit(draw)(split)):
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    samplers = _count(jax.make_jaxpr(draw)(split).jaxpr, "random_bits")
    dtypes = {jnp.dtype(d) for _, d in _SPECS}
    shapes = {(s, jnp.dtype(d)) for s, d in _SPECS}
    expected = {"rbg": len(_SPECS), "not partitionable": len(shapes)}
    assert samplers == expected.get(keys, len(dtypes))


def test_complex_draws_are_what_each_key_draws_alone():
    """A complex normal draw splits its key (real and imaginary parts): drawn per
    shape, the same numbers."""
    from eqxopt._misc import draws_per_leaf

    specs = [((3, 2), jnp.complex64), ((3, 2), jnp.complex64), ((4,), jnp.float32)]
    split = jr.split(jr.key(0), len(specs))
    got = draws_per_leaf(jr.normal, split, specs)
    for g, k, (shape, dtype) in zip(got, split, specs, strict=True):
        np.testing.assert_array_equal(np.asarray(g), jr.normal(k, shape, dtype))
