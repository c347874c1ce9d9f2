"""GaLore beyond Optax parity: complex gradients."""

import jax
import jax.numpy as jnp
import jax.random as jr

import eqxopt


def test_galore_projects_complex_gradients_with_conjugate_transposes():
    with jax.numpy_dtype_promotion("standard"):
        # At full rank the projection is the identity: GaLore(lr=1) over a unit scale
        # returns -g, for a left (4, 6) and a right (6, 4) projector.
        k1, k2 = jr.split(jr.key(0))
        g = jax.lax.complex(jr.normal(k1, (4, 6)), jr.normal(k2, (4, 6)))
        for grad in (g, g.T):
            opt = eqxopt.GaLore(1.0, rank=4, base_optimizer=eqxopt.Scale(1.0))
            params = {"w": jnp.zeros(grad.shape, jnp.complex64)}
            updates, _ = opt.update({"w": grad}, opt.init(params), params)
            assert jnp.allclose(updates["w"], -grad, atol=1e-5)
