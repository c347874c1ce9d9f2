"""Mixed precision end to end (API.md section 2, rule 7): a bfloat16 Equinox model
trained with float32 gradients tracks the same model trained in float32."""

import functools as ft

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import pytest

import eqxopt

from .helpers import avals


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
