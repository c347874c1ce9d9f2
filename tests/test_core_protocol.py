"""The optimizer protocol (design.md#protocol): whole models as params, `step`,
`hyperparams`, schedule counting, array hyperparameters without recompiling,
construction without arrays, serialisation."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import pytest

import eqxopt

from .helpers import (
    CASES,
    make_params,
    random_like,
    tree_allclose,
)
from .test_properties import check_state_properties


def _mlp(dtype=jnp.float32):
    return eqx.nn.MLP(3, 2, 8, 2, key=jr.key(0), dtype=dtype)


def _loss(model, x):
    return jnp.mean(jax.vmap(model)(x) ** 2)


def test_unfiltered_model_as_params():
    model = _mlp()
    # A per-leaf mask callable only ever sees the optimised (inexact array) leaves.
    opt = eqxopt.AdamW(1e-2, mask=lambda p: p.ndim == 2)
    state = opt.init(model)  # functions and other non-array leaves map to None
    assert state.mu.layers[0].weight.shape == (8, 3)
    assert all(
        x is None or eqx.is_inexact_array(x)
        for x in jtu.tree_leaves(state.mu, is_leaf=lambda x: x is None)
    )
    x = jr.normal(jr.key(1), (16, 3), jnp.float32)

    @eqx.filter_jit
    def train_step(model, state):
        loss, grads = eqx.filter_value_and_grad(_loss)(model, x)
        model, state = opt.step(model, grads, state)
        return model, state, loss

    losses = []
    for _ in range(20):
        model, state, loss = train_step(model, state)
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]


def test_step_is_update_then_apply():
    params = make_params()
    grads = random_like(jr.key(2), params)
    opt = eqxopt.Adam(1e-2)
    state = opt.init(params)
    new_params, _ = opt.step(params, grads, state)
    updates, _ = opt.update(grads, state, params)
    assert tree_allclose(new_params, eqx.apply_updates(params, updates))


# Entries whose `step` writes some state buffers after the new params (so that XLA
# updates them in place): on leaves large enough to be ordered (>= 4096 elements),
# that `step` still equals `update` + `apply_updates`, under `jit`, over three steps.
_ORDERED = [
    c
    for c in CASES
    if type(c.make())._write_after_params and c.shapes is None and c.loss is None
]


def test_some_registry_entries_order_their_step():
    assert {type(c.make()).__name__ for c in _ORDERED} >= {"AdaN", "ADOPT"}


@pytest.mark.parametrize("case", _ORDERED, ids=lambda c: c.id)
def test_ordered_step_is_update_then_apply(case):
    opt = case.make()
    params = make_params(shapes={"w": (64, 96), "b": (96,)})

    def both(params, keys):
        p1 = p2 = params
        s1 = s2 = opt.init(params)
        for key in keys:
            grads = random_like(key, params)
            p1, s1 = opt.step(p1, grads, s1)
            updates, s2 = opt.update(grads, s2, p2)
            p2 = eqx.apply_updates(p2, updates)
        return (p1, s1), (p2, s2)

    stepped, updated = jax.jit(both)(params, jr.split(jr.key(3), 3))
    assert eqx.tree_equal(stepped, updated, typematch=True, rtol=1e-6, atol=1e-7)


def test_schedules_count_updates_already_applied():
    seen = []

    def schedule(count):
        seen.append(count)
        return 0.1 * (count + 1).astype(jnp.float32)

    params = {"x": jnp.ones((), jnp.float32)}
    opt = eqxopt.SGD(schedule)
    state = opt.init(params)
    grads = {"x": jnp.ones((), jnp.float32)}
    for k in range(3):
        updates, state = opt.update(grads, state, params)
        # The k-th update (k from 0) uses schedule(k).
        assert jnp.allclose(updates["x"], -0.1 * (k + 1))
    assert [int(c) for c in seen] == [0, 1, 2]


def test_hyperparams_layout():
    params = make_params()
    opt = eqxopt.Chain(
        eqxopt.ClipByGlobalNorm(1.0),
        eqxopt.AdamW(eqxopt.schedules.Linear(1.0, 0.0, 10), b1=0.8),
    )
    state = opt.init(params)
    grads = random_like(jr.key(0), params)
    for _ in range(3):
        _, state = opt.update(grads, state, params)
    hp = opt.hyperparams(state)
    assert set(hp) == {0, 1}
    assert hp[0] == {"max_norm": 1.0}
    assert hp[1]["b1"] == 0.8 and hp[1]["weight_decay"] == 1e-4
    assert jnp.allclose(hp[1]["learning_rate"], 0.7)  # the 4th update uses lr(3)
    assert "mask" not in hp[1] and "state_dtype" not in hp[1]


def test_array_learning_rate_changes_without_retrace():
    params = make_params()
    grads = random_like(jr.key(0), params)
    opt = eqxopt.Adam(jnp.asarray(1e-2, jnp.float32))
    state = opt.init(params)
    traces = 0

    @eqx.filter_jit
    def step(opt, state):
        nonlocal traces
        traces += 1
        return opt.update(grads, state, params)

    u1, _ = step(opt, state)
    opt2 = eqx.tree_at(lambda o: o.learning_rate, opt, jnp.asarray(1e-3, jnp.float32))
    u2, _ = step(opt2, state)
    assert traces == 1
    ratio = u2["linear"]["weight"] / u1["linear"]["weight"]
    assert jnp.allclose(ratio, 0.1, rtol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_construction_creates_no_arrays_and_leaks_no_tracer(case):
    """Built inside one trace, the optimizer holds no arrays, and used in another it
    passes the property checks of test_properties.py (float32 params and grads: that
    test leaves this dtype pair to this one). Tracing is where a leaked tracer would
    fail."""
    built = []

    @jax.jit
    def build(x):
        built.append(case.make())
        return x

    build(1.0)
    opt = built[0]
    assert not any(isinstance(x, jax.Array) for x in jtu.tree_leaves(opt))
    check_state_properties(opt, case, "float32", "same")


def test_no_params_needed_without_weight_decay():
    params = {"w": jnp.ones((3, 2), jnp.float32)}
    opts: list[eqxopt.AbstractOptimizer] = [
        eqxopt.Novograd(1e-2),
        eqxopt.Lion(1e-3, weight_decay=0.0),
    ]
    for opt in opts:
        updates, _ = opt.update(params, opt.init(params))
        assert updates["w"].shape == (3, 2)


def test_write_after_leaves_every_value_bit_for_bit():
    from eqxopt._misc import write_after

    x = jnp.array([1.5, -0.0, 0.0, jnp.inf, -jnp.inf, jnp.nan, -3.0])
    for dependency in (x[::-1], jnp.float32(jnp.nan), jnp.float32(2.0)):
        got = write_after(x, dependency)
        assert np.array_equal(
            np.asarray(got).view(np.uint32), np.asarray(x).view(np.uint32)
        )
    z = jax.lax.complex(x, -x)
    assert np.array_equal(np.asarray(write_after(z, x)), np.asarray(z), equal_nan=True)


def test_a_refused_init_leaves_no_trace_for_the_next_optimizer():
    # `init` refusing complex params must not leave its call on the stack that tells a
    # `super().init(...)` from a first call: an optimizer built later (which may reuse
    # the refused one's `id`) must still refuse them.
    params = {"w": jnp.ones((3, 3), jnp.complex64)}
    for _ in range(3):
        opt = eqxopt.Shampoo(1e-3)
        with pytest.raises(ValueError, match="takes real params only"):
            opt.init(params)
        del opt
