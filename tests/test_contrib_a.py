"""Behaviour of Optax's contrib catalogue (part 1) that the registry cannot express:
MoMo's required `value=`, complex params through SplitRealAndImaginary, Mechanic's
wrapper plumbing, and the documented differences from Optax."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import optax
import pytest

import eqxopt

from .helpers import make_params, random_like, tree_allclose


def _loss(params):
    return sum(jnp.sum(jnp.square(p - 0.3)) for p in jax.tree.leaves(params))


@pytest.mark.parametrize("make", [eqxopt.Momo, eqxopt.MomoAdam])
@pytest.mark.parametrize("jit", [False, True])
def test_momo_needs_the_loss_value(make, jit):
    opt = make()
    params = make_params()
    grads = jax.grad(_loss)(params)
    state = opt.init(params)
    update = eqx.filter_jit(opt.update) if jit else opt.update
    # Raised at trace time, naming the argument.
    with pytest.raises(ValueError, match="`value=`"):
        update(grads, state, params)
    with pytest.raises(ValueError, match="`value=`"):
        update(grads, state, params, value=None)
    updates, _ = update(grads, state, params, value=_loss(params))
    assert all(jnp.all(jnp.isfinite(u)) for u in jax.tree.leaves(updates))


@pytest.mark.parametrize(
    "dtype, real", [(jnp.complex64, jnp.float32), (jnp.complex128, jnp.float64)]
)
@pytest.mark.parametrize(
    "inner, reference",
    [
        (lambda: eqxopt.Adam(1e-2), lambda: optax.adam(1e-2)),
        (
            lambda: eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.SGD(0.1, 0.9)),
            lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, 0.9)),
        ),
    ],
    ids=["adam", "chain_clip_sgd"],
)
def test_split_real_and_imaginary_on_complex_params(inner, reference, dtype, real):
    keys = jr.split(jr.key(0), 2)
    real_params = make_params(real, key=keys[0])
    imag_params = make_params(real, key=keys[1])
    params = jax.tree.map(lambda a, b: jax.lax.complex(a, b), real_params, imag_params)
    assert all(p.dtype == dtype for p in jax.tree.leaves(params))
    params["real_leaf"] = jnp.linspace(-1.0, 1.0, 4, dtype=real)  # passes through
    ours = eqxopt.SplitRealAndImaginary(inner())
    ref = optax.contrib.split_real_and_imaginary(reference())
    s_ours, s_ref = ours.init(params), ref.init(params)
    # The inner state is real: a complex leaf's buffers are a `.real` and an
    # `.imaginary` part in the real dtype.
    for leaf in jax.tree.leaves(s_ours):
        assert not jnp.iscomplexobj(leaf)
    step = eqx.filter_jit(ours.update)
    p_ours = p_ref = params
    key = jr.key(1)
    rtol = 1e-6 if real == jnp.float32 else 1e-12
    for i in range(5):
        key, k1, k2 = jr.split(key, 3)
        grads = jax.tree.map(
            lambda a, b, p: jax.lax.complex(a, b) if jnp.iscomplexobj(p) else a,
            random_like(k1, real_params | {"real_leaf": params["real_leaf"]}),
            random_like(k2, real_params | {"real_leaf": params["real_leaf"]}),
            params,
        )
        u_ours, s_ours = step(grads, s_ours, p_ours)
        with jax.numpy_dtype_promotion("standard"):  # Optax is not strict-clean
            u_ref, s_ref = ref.update(grads, s_ref, p_ref)
        # Updates keep each param's dtype (complex stays complex, real stays real).
        assert jax.tree.map(lambda u: u.dtype, u_ours) == jax.tree.map(
            lambda p: p.dtype, params
        )
        p_ours = eqx.apply_updates(p_ours, u_ours)
        p_ref = optax.apply_updates(p_ref, u_ref)
        assert tree_allclose(p_ours, p_ref, rtol=rtol, atol=1e-7), f"step {i}"


def test_split_real_and_imaginary_descends_on_a_complex_loss():
    target = jnp.array([2 + 1j, -1 + 0.5j, 0.25j], jnp.complex64)
    params = {"z": jnp.zeros(3, jnp.complex64)}
    loss = lambda p: jnp.sum(jnp.abs(p["z"] - target) ** 2)
    opt = eqxopt.SplitRealAndImaginary(eqxopt.Adam(0.1))
    state = opt.init(params)
    for _ in range(200):
        grads = jax.tree.map(jnp.conj, jax.grad(loss)(params))
        params, state = opt.step(params, grads, state)
        assert isinstance(state, eqxopt.SplitRealAndImaginaryState)
    assert jnp.allclose(params["z"], target, atol=2e-2)


def test_mechanize_passes_extra_arguments_and_nests_hyperparams():
    # MoMo inside Mechanic: the `value=` reaches the base optimizer.
    opt = eqxopt.Mechanize(eqxopt.Momo(0.5), weight_decay=0.0)
    params = make_params()
    state = opt.init(params)
    grads = jax.grad(_loss)(params)
    with pytest.raises(ValueError, match="`value=`"):
        opt.update(grads, state, params)
    params, state = opt.step(params, grads, state, value=_loss(params))
    assert isinstance(state, eqxopt.MechanizeState)
    hp = opt.hyperparams(state)
    assert hp["weight_decay"] == 0.0
    assert hp["base_optimizer"]["learning_rate"] == 0.5


def test_mechanize_names_the_drifting_leaf_of_its_base_optimizer():
    class Drifting(eqxopt.AbstractOptimizer):
        def init(self, params):
            return {"n": jnp.zeros((), jnp.int32)}

        def update(self, grads, state, params=None, **extra):
            return grads, {"n": state["n"].astype(jnp.float32)}  # int32 drifts

    opt = eqxopt.Mechanize(Drifting())
    params = make_params()
    with pytest.raises(eqxopt.StateDriftError) as info:
        eqxopt.verify(opt, params)
    assert info.value.path == ".base_optimizer_state['n']"


def test_dadapt_adamw_survives_a_zero_first_step():
    # With a warmup from 0, the first step adds nothing to the gradient sum s, and
    # Optax's estimate r / ||s||_1 is 0 / 0 = NaN from then on. Ours keeps d.
    schedule = eqxopt.schedules.WarmupCosineDecay(0.0, 1.0, 3, 10)
    opt = eqxopt.DAdaptAdamW(schedule, estim_lr0=1e-2)
    ref = optax.contrib.dadapt_adamw(
        optax.warmup_cosine_decay_schedule(0.0, 1.0, 3, 10), estim_lr0=1e-2
    )
    params = make_params()
    state, ref_state = opt.init(params), ref.init(params)
    assert isinstance(ref_state, optax.contrib.DAdaptAdamWState)
    for _ in range(10):
        grads = jax.grad(_loss)(params)
        params, state = opt.step(params, grads, state)
        assert isinstance(state, eqxopt.DAdaptAdamWState)
        with jax.numpy_dtype_promotion("standard"):
            _, ref_state = ref.update(grads, ref_state, params)
        assert isinstance(ref_state, optax.contrib.DAdaptAdamWState)
    assert jnp.isnan(ref_state.estim_lr)  # Optax's documented failure
    assert jnp.isfinite(state.estim_lr) and state.estim_lr > 2e-2  # d has grown
    assert all(jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params))


def test_cocob_in_float16_steps_where_its_eps_rounds_to_zero():
    # float16 stores COCOB's initial scale eps = 1e-8 as 0: Optax's first step with a
    # zero gradient is 0 / 0 = NaN. Ours takes eps as the least scale.
    params = {"w": jnp.ones(3, jnp.float16)}
    zeros = {"w": jnp.zeros(3, jnp.float16)}
    opt, ref = eqxopt.COCOB(), optax.contrib.cocob()
    state, ref_state = opt.init(params), ref.init(params)
    assert state.scale["w"][0] == 0
    ref_updates, _ = ref.update(zeros, ref_state, params)
    assert jnp.all(jnp.isnan(jax.tree.leaves(ref_updates)[0]))  # Optax's failure
    grads = {"w": jnp.array([0.5, -1.0, 2.0], jnp.float16)}
    for g in (zeros, zeros, grads):
        updates, state = opt.update(g, state, params)
        assert jnp.all(jnp.isfinite(updates["w"]))
    assert jnp.all(jnp.sign(updates["w"]) == -jnp.sign(grads["w"]))


@pytest.mark.parametrize(
    "make",
    [
        lambda: eqxopt.DoG(),
        lambda: eqxopt.DoWG(),
        lambda: eqxopt.DAdaptAdamW(),
        lambda: eqxopt.Momo(),
    ],
    ids=["dog", "dowg", "dadapt_adamw", "momo"],
)
def test_running_scalars_are_at_least_float32(make):
    # Optax keeps these sums in the params' lowest precision: in bfloat16 a running
    # sum of squared norms stops growing after a few hundred steps.
    opt = make()
    params = make_params(jnp.bfloat16, {"w": (5, 3), "b": (5,)})  # no 0-d param
    state = opt.init(params)
    scalars = [
        x for x in jax.tree.leaves(state) if x.ndim == 0 and x.dtype != jnp.int32
    ]
    assert scalars and all(x.dtype == jnp.float32 for x in scalars)
    buffers = [x for x in jax.tree.leaves(state) if x.ndim > 0]
    assert all(x.dtype == jnp.bfloat16 for x in buffers)


def test_dog_sum_keeps_growing_in_bfloat16():
    opt = eqxopt.DoG()
    params = {"w": jnp.ones(64, jnp.bfloat16)}
    grads = {"w": jnp.ones(64, jnp.bfloat16)}  # |g|^2 = 64 per step
    state = opt.init(params)
    step = eqx.filter_jit(opt.update)
    for _ in range(600):
        _, state = step(grads, state, params)
    # 600 * 64 exactly; bfloat16 (8 mantissa bits) would be stuck at 2^15 or below.
    assert state.sum_sq_norm_grads == 600 * 64


def test_clip_and_adopt_bound_the_modulus_of_complex_entries():
    with jax.numpy_dtype_promotion("standard"):
        # Optax's clip raises on complex numbers (they have no order); ours clips the
        # modulus and keeps the phase, which is jnp.clip on real entries.
        z = jnp.array([3 + 4j, 0.3 - 0.4j, -2.0 + 0j], jnp.complex64)
        updates, _ = eqxopt.Clip(1.0).update({"z": z}, eqxopt.EmptyState())
        assert jnp.allclose(
            updates["z"], jnp.array([0.6 + 0.8j, 0.3 - 0.4j, -1.0 + 0j])
        )
        # ADOPT's first real step (step 1) clips g / sqrt(v_0) to 1 ** 0.25 = 1.
        opt = eqxopt.ADOPT(1.0, b1=0.0)
        params = {"z": jnp.zeros(3, jnp.complex64)}
        state = opt.init(params)
        _, state = opt.update({"z": jnp.ones(3, jnp.complex64)}, state, params)
        updates, _ = opt.update({"z": z}, state, params)
        assert jnp.allclose(jnp.abs(updates["z"]), jnp.array([1.0, 0.5, 1.0]))
        u = updates["z"]
        assert jnp.allclose(-u / jnp.abs(u), z / jnp.abs(z))  # the phase of g


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


def test_dp_noise_on_complex_entries_has_the_full_std_in_each_part():
    with jax.numpy_dtype_promotion("standard"):
        opt = eqxopt.DifferentiallyPrivateAggregate(1.0, 1.0, key=0)
        params = {"w": jnp.zeros(20_000, jnp.complex64)}
        grads = {
            "w": jnp.zeros((1, 20_000), jnp.complex64)
        }  # batch of 1: std = C sigma
        updates, _ = opt.update(grads, opt.init(params), params)
        assert 0.98 < jnp.std(updates["w"].real) < 1.02
        assert 0.98 < jnp.std(updates["w"].imag) < 1.02
