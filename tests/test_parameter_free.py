"""Learning-rate-free methods beyond Optax parity: MoMo's loss value, Mechanic's
nesting, and the low-precision cases where Optax's running sums stall."""

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest

import eqxopt

from .helpers import make_params


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


def test_polyak_needs_value_and_prodigy_survives_zero_grads():
    x = {"w": jnp.ones((3,), jnp.float32)}
    opt = eqxopt.PolyakSGD()
    with pytest.raises(ValueError, match="value=loss"):
        opt.update(x, opt.init(x), x)
    prodigy = eqxopt.Prodigy()
    state = prodigy.init(x)
    zeros = {"w": jnp.zeros((3,), jnp.float32)}
    for _ in range(2):
        x, state = prodigy.step(x, zeros, state)
    assert float(state.estim_lr) == pytest.approx(1e-6)
    assert bool(jnp.all(jnp.isfinite(x["w"])))
