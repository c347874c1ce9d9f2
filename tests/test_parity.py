"""Every registry entry with an Optax reference matches it, step by step."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import optax
import pytest

from .helpers import case_extra, case_grads, make_params, PARITY_CASES, tree_allclose


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", PARITY_CASES, ids=lambda c: c.id)
def test_matches_optax(case, dtype):
    params = make_params(dtype, case.shapes)
    ours, ref = case.make(), case.reference()

    @eqx.filter_jit  # both steps in one program: one compilation per case
    def steps(ours_args, ref_args):
        g, s, p, e = ours_args
        out = ours.update(g, s, p, **e)
        g, s, p, e = ref_args
        with jax.numpy_dtype_promotion("standard"):  # Optax is not strict-clean
            return out, ref.update(g, s, p, **e)

    s_ours, s_ref = ours.init(params), ref.init(params)
    p_ours = p_ref = params
    rtol = case.rtol if dtype == jnp.float32 else case.rtol64
    atol = case.atol if dtype == jnp.float32 else case.atol64
    key = jr.key(1)
    for i in range(case.steps):
        key, sub = jr.split(key)
        g_ours, g_ref = case_grads(case, p_ours, sub), case_grads(case, p_ref, sub)
        (u_ours, s_ours), (u_ref, s_ref) = steps(
            (g_ours, s_ours, p_ours, case_extra(case, p_ours)),
            (g_ref, s_ref, p_ref, case_extra(case, p_ref)),
        )
        p_ours = eqx.apply_updates(p_ours, u_ours)
        p_ref = optax.apply_updates(p_ref, u_ref)
        assert tree_allclose(p_ours, p_ref, rtol=rtol, atol=atol), (
            f"step {i}: params differ from Optax\n{p_ours}\n{p_ref}"
        )
