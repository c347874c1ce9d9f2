"""Mixed precision end to end (dtype rule 7): a bfloat16 Equinox model
trained with float32 gradients tracks the same model trained in float32."""

import functools as ft

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import pytest

import eqxopt

from .helpers import avals, CASES, make_params


STEPS = 300


def _cast(model, dtype):
    return jtu.tree_map(
        lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model
    )


def _data():
    kx, kw = jr.split(jr.key(1))
    x = jr.normal(kx, (128, 4), jnp.float32)
    w = jr.normal(kw, (4,), jnp.float32)
    y = jnp.sin(x @ w)[:, None] + 0.5 * x[:, :1] ** 2
    return x, y


def _loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def _train(dtype, state_dtype):
    """`STEPS` full-batch AdamW steps in one `lax.scan`. The model's params are in
    `dtype`; the forward pass and the grads are float32 (an upcast copy is
    differentiated), so a bfloat16 model receives float32 grads (rule 7)."""
    model = _cast(eqx.nn.MLP(4, 1, 32, 2, key=jr.key(0)), dtype)
    opt = eqxopt.AdamW(3e-3, weight_decay=1e-4, state_dtype=state_dtype)
    state = opt.init(model)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    x, y = _data()

    def body(carry, _):
        params, state = carry
        loss, grads = jax.value_and_grad(lambda p: _loss(eqx.combine(p, static), x, y))(
            _cast(params, jnp.float32)
        )
        params, state = opt.step(params, grads, state)
        return (params, state), loss

    (params, final_state), losses = jax.jit(
        lambda c: lax.scan(body, c, None, length=STEPS)
    )((params, state))
    return params, state, final_state, losses


@ft.cache
def _float32_losses():
    return _train(jnp.float32, None)[3]


@pytest.mark.parametrize("state_dtype", [None, jnp.float32], ids=["bf16", "f32"])
def test_bfloat16_training_tracks_float32(state_dtype):
    params, state, final_state, losses = _train(jnp.bfloat16, state_dtype)
    losses32 = _float32_losses()

    # Types never moved: bfloat16 params, moments in bfloat16 or `state_dtype`.
    assert all(p.dtype == jnp.bfloat16 for p in jtu.tree_leaves(params))
    assert avals(final_state) == avals(state)
    moment_dtype = state_dtype or jnp.bfloat16
    assert all(m.dtype == moment_dtype for m in jtu.tree_leaves(final_state.mu))

    # Both runs learn (the loss falls by at least 10x)...
    assert losses32[-1] < 0.1 * losses32[0]
    assert losses[-1] < 0.1 * losses[0]
    # ...and the bfloat16 run tracks the float32 one: at every step its loss is within
    # 10% of the float32 loss plus 1% of the initial loss (bfloat16 weights carry ~3
    # significant digits, so the two trajectories separate slowly).
    gap = jnp.abs(losses - losses32)
    assert jnp.all(gap <= 0.1 * losses32 + 0.01 * losses32[0]), float(jnp.max(gap))


# The diagonal adaptive methods, one case per optimizer (the `ScaleBy*` chains and
# variants share its arithmetic).
_ADAPTIVE = (
    "lion",
    "rmsprop",
    "rmsprop_centered_nesterov",
    "adagrad",
    "adafactor",
    "adamax",
    "amsgrad",
    "nadam",
    "radam",
    "adabelief",
    "yogi",
    "lamb",
    "lars",
    "novograd",
)
_NAMED = [c for c in CASES if c.id in _ADAPTIVE]


@pytest.mark.parametrize("case", _NAMED, ids=lambda c: c.id)
def test_float16_matches_float32_arithmetic(case):
    """float16 params with gradients ~1e-4 (whose squares underflow in float16): two
    steps must match the same steps done on float32 copies to float16 rounding, with
    no NaN or inf."""
    opt = case.make()
    params16 = make_params(jnp.float16, case.shapes)
    step = eqx.filter_jit(lambda g, s, p: opt.update(g, s, p))
    state16 = opt.init(params16)
    template32 = opt.init(jtu.tree_map(lambda x: x.astype(jnp.float32), params16))
    key = jr.key(0)
    for _ in range(2):
        # Both runs start each step from the same (float16-representable) params and
        # state: only the arithmetic inside the step may differ.
        params32 = jtu.tree_map(lambda x: x.astype(jnp.float32), params16)
        state32 = jtu.tree_map(lambda a, b: a.astype(b.dtype), state16, template32)
        key, sub = jr.split(key)
        leaves, treedef = jtu.tree_flatten(params16)
        keys = jr.split(sub, len(leaves))
        g16 = jtu.tree_unflatten(
            treedef,
            [
                (1e-4 * jr.normal(k, x.shape, jnp.float32)).astype(jnp.float16)
                for k, x in zip(keys, leaves)
            ],
        )
        g32 = jtu.tree_map(lambda x: x.astype(jnp.float32), g16)
        u16, state16 = step(g16, state16, params16)
        u32, _ = step(g32, state32, params32)
        for a, b in zip(jtu.tree_leaves(u16), jtu.tree_leaves(u32)):
            assert a.dtype == jnp.float16
            assert jnp.all(jnp.isfinite(a)), case.id
            scale = float(jnp.max(jnp.abs(b)))
            np.testing.assert_allclose(
                np.asarray(a, np.float32),
                np.asarray(b),
                rtol=2e-3,
                atol=2e-3 * scale + 1e-7,
            )
        params16 = eqx.apply_updates(params16, u16)
