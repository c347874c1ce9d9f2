"""Optax and optimistix interoperation (interop.md)."""

import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import optax
import optimistix as optx
import pytest

import eqxopt

from .helpers import case_extra, case_grads, CASES, make_params, random_like


STEPS = 2


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_to_optax_in_a_plain_optax_loop(case):
    """A plain Optax loop (`tx.init`, `tx.update`, `optax.apply_updates`) around
    `to_optax(opt)` computes what eqxopt's own loop (`opt.init`, `opt.step`) does.
    Mostly the two loops trace to the same jaxpr (so they agree on every input), which
    costs a trace instead of a compile per registry entry; where `step` is fused
    (Lion, MultiSteps) their values are compared."""

    def optax_loop(params, keys):
        tx = eqxopt.to_optax(case.make())
        assert isinstance(tx, optax.GradientTransformationExtraArgs)
        state = tx.init(params)
        for k in keys:
            grads = case_grads(case, params, k)
            extra = case_extra(case, params)
            updates, state = tx.update(grads, state, params, **extra)
            params = optax.apply_updates(params, updates)
        return params, state

    def own_loop(params, keys):
        opt = case.make()
        state = opt.init(params)
        for k in keys:
            grads = case_grads(case, params, k)
            params, state = opt.step(params, grads, state, **case_extra(case, params))
        return params, state

    args = (make_params(jnp.float32, case.shapes), jr.split(jr.key(0), STEPS))

    ours = jax.make_jaxpr(own_loop, return_shape=True)(*args)
    theirs = jax.make_jaxpr(optax_loop, return_shape=True)(*args)
    assert jtu.tree_structure(theirs[1]) == jtu.tree_structure(ours[1])
    if str(theirs[0]) == str(ours[0]):
        assert eqx.tree_equal(theirs[0].consts, ours[0].consts)
    else:
        # Another computation: an optimizer whose `step` fuses the update into the
        # params (Lion, MultiSteps). Compare the values, both loops in one compile.
        both = jax.jit(lambda *a: (own_loop(*a), optax_loop(*a)))
        ours_value, theirs_value = both(*args)
        assert eqx.tree_equal(ours_value, theirs_value, rtol=1e-6, atol=1e-7)


class _ScaleByValue(eqxopt.AbstractOptimizer):
    """Needs the extra argument `value=`: checks that it is forwarded."""

    def init(self, params):
        return eqxopt.EmptyState()

    def update(self, grads, state, params=None, *, value, **extra):
        return jtu.tree_map(lambda g: g * value.astype(g.dtype), grads), state


def test_to_optax_under_jit_in_optax_chain_with_extra_args():
    params = make_params()
    grads = random_like(jr.key(0), params)
    lr = jnp.asarray(1e-2, jnp.float32)  # an array hyperparameter: jit still works
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        eqxopt.to_optax(_ScaleByValue()),
        eqxopt.to_optax(eqxopt.Adam(lr, b1=0.8)),
    )
    ours = eqxopt.Chain(
        eqxopt.ClipByGlobalNorm(1.0), _ScaleByValue(), eqxopt.Adam(lr, b1=0.8)
    )
    value = jnp.asarray(3.0, jnp.float32)
    update = jax.jit(tx.update)
    state, ours_state = tx.init(params), ours.init(params)
    for _ in range(STEPS):
        with jax.numpy_dtype_promotion("standard"):  # Optax's clip is not strict-clean
            updates, state = update(grads, state, params, value=value)
        want, ours_state = ours.update(grads, ours_state, params, value=value)
        assert eqx.tree_equal(updates, want, typematch=True, rtol=1e-6, atol=1e-8)
    # `optax.MultiSteps` around a `to_optax` transformation.
    multi = optax.MultiSteps(eqxopt.to_optax(eqxopt.Adam(1e-2)), every_k_schedule=2)
    m_state, m_update = multi.init(params), jax.jit(multi.update)
    for k in range(4):
        with jax.numpy_dtype_promotion("standard"):
            updates, m_state = m_update(grads, m_state, params)
        emitted = k % 2 == 1
        assert bool(jnp.any(updates["linear"]["weight"] != 0)) == emitted


def _optax_transforms():
    return {
        "adam": lambda: optax.adam(1e-2, b1=0.8, b2=0.99),
        "chain_clip_adam": lambda: optax.chain(
            optax.clip_by_global_norm(0.5), optax.adamw(1e-2, weight_decay=0.1)
        ),
        "multisteps": lambda: optax.MultiSteps(optax.adam(1e-2), every_k_schedule=2),
        "inject_hyperparams_sgd": lambda: optax.inject_hyperparams(optax.sgd)(
            learning_rate=0.1, momentum=0.9
        ),
    }


@pytest.mark.parametrize("name", list(_optax_transforms()))
def test_from_optax_matches_optax(name):
    make = _optax_transforms()[name]
    params = make_params(jnp.float32)
    opt, tx = eqxopt.from_optax(make()), make()
    assert isinstance(opt, eqxopt.AbstractOptimizer)
    state = opt.init(params)
    assert isinstance(state, eqxopt.FromOptaxState)
    step = eqx.filter_jit(lambda o, g, s, p: o.update(g, s, p))
    with jax.numpy_dtype_promotion("standard"):
        ref_state = tx.init(params)
    ref_update = jax.jit(tx.update)
    p_ours = p_ref = params
    for k in jr.split(jr.key(1), 5):
        grads = random_like(k, params)
        updates, state = step(opt, grads, state, p_ours)
        with jax.numpy_dtype_promotion("standard"):
            ref_updates, ref_state = ref_update(grads, ref_state, p_ref)
        assert eqx.tree_equal(updates, ref_updates, typematch=True)
        assert eqx.tree_equal(state.inner_state, ref_state, typematch=True)
        p_ours = eqx.apply_updates(p_ours, updates)
        p_ref = optax.apply_updates(p_ref, ref_updates)
    if name == "inject_hyperparams_sgd":
        assert jnp.allclose(opt.hyperparams(state)["learning_rate"], 0.1)


def test_from_optax_on_a_whole_model_and_in_a_chain():
    model = eqx.nn.MLP(3, 2, 8, 1, key=jr.key(0))  # activation functions as leaves
    opt = eqxopt.Chain(
        eqxopt.from_optax(optax.clip_by_global_norm(1.0)), eqxopt.Adam(1e-2)
    )
    state = opt.init(model)
    x = jr.normal(jr.key(1), (16, 3))

    @eqx.filter_jit
    def step(model, state):
        loss, grads = eqx.filter_value_and_grad(
            lambda m: jnp.mean(jax.vmap(m)(x) ** 2)
        )(model)
        model, state = opt.step(model, grads, state)
        return model, state, loss

    losses = []
    for _ in range(10):
        model, state, loss = step(model, state)
        losses.append(float(loss))
    assert losses[-1] < losses[0]


def test_from_optax_catches_optax_dtype_drift():
    """Optax 0.2.8's Adam moments turn bfloat16 -> float32 with float32 grads."""
    params = {"w": jnp.ones(3, jnp.bfloat16)}
    grads = {"w": jnp.ones(3, jnp.float32)}
    opt = eqxopt.from_optax(optax.adam(1e-2))
    state = opt.init(params)
    with pytest.raises(eqxopt.StateDriftError, match=r"state\.inner_state\[0\]\.mu"):
        opt.update(grads, state, params)
    # eqxopt's own Adam keeps bfloat16 moments.
    eqxopt.Adam(1e-2).update(grads, eqxopt.Adam(1e-2).init(params), params)


def test_round_trips_and_type_errors():
    adam = eqxopt.Adam(1e-2)
    assert eqxopt.from_optax(eqxopt.to_optax(adam)) is adam
    tx = optax.adam(1e-2)
    assert eqxopt.to_optax(eqxopt.from_optax(tx)) is tx
    with pytest.raises(TypeError, match="takes an eqxopt optimizer"):
        eqxopt.to_optax(tx)  # pyright: ignore
    with pytest.raises(TypeError, match="given the eqxopt optimizer Adam"):
        eqxopt.from_optax(adam)
    with pytest.raises(TypeError, match="takes an `optax.GradientTransformation`"):
        eqxopt.from_optax(42)


def test_missing_optax_raises_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "optax", None)  # `import optax` now fails
    for fn, arg in [(eqxopt.to_optax, eqxopt.SGD(0.1)), (eqxopt.from_optax, None)]:
        with pytest.raises(ImportError, match=r"pip install eqxopt\[optax\]"):
            fn(arg)


def test_import_eqxopt_without_optax():
    code = (
        "import sys; sys.modules['optax'] = None; sys.modules['orbax'] = None\n"
        "import jax.numpy as jnp, eqxopt\n"
        "opt = eqxopt.AdamW(1e-2)\n"
        "state = opt.init({'w': jnp.ones(3)})\n"
        "try:\n"
        "    eqxopt.to_optax(opt)\n"
        "except ImportError as e:\n"
        "    assert 'eqxopt[optax]' in str(e)\n"
        "else:\n"
        "    raise AssertionError('no ImportError')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_optimistix_optax_minimiser_with_eqxopt_adam():
    target = {"a": jnp.asarray([1.0, -2.0, 3.0]), "b": jnp.asarray(0.5)}

    def fn(y, args):
        a, b = (
            jnp.sum(w * (y[k] - target[k]) ** 2) for k, w in (("a", 1.0), ("b", 4.0))
        )
        return a + b

    lr = eqxopt.schedules.ExponentialDecay(0.1, transition_steps=100, decay_rate=0.5)
    solver = optx.OptaxMinimiser(eqxopt.to_optax(eqxopt.Adam(lr)), rtol=1e-6, atol=1e-6)
    y0 = {"a": jnp.zeros(3), "b": jnp.asarray(0.0)}
    with jax.numpy_dtype_promotion("standard"):  # optimistix is not strict-clean
        sol = optx.minimise(fn, solver, y0, max_steps=2000)
    assert sol.result == optx.RESULTS.successful
    assert eqx.tree_equal(sol.value, target, rtol=1e-3, atol=1e-3)


def test_from_optax_forwards_only_the_extra_arguments_a_transformation_accepts():
    """`optax.contrib.sam`'s `update` takes `grad_fn=` but no `**kwargs`; in a `Chain`
    with `ReduceOnPlateau` it is sent `value=` too, and must get only `grad_fn`."""
    sam = optax.contrib.sam(optax.sgd(0.1), optax.sgd(0.05))
    opt = eqxopt.Chain(eqxopt.from_optax(sam), eqxopt.ReduceOnPlateau(patience=1))
    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.array([1.0, -2.0, 0.5])}
    state = opt.init(params)
    step = eqx.filter_jit(lambda g, s, p, v: opt.update(g, s, p, value=v))
    updates, state = step(grads, state, params, jnp.asarray(2.0))
    with jax.numpy_dtype_promotion("standard"):  # Optax is not strict-clean
        expected, _ = sam.update(grads, sam.init(params), params)
    assert eqx.tree_equal(updates, expected)
    # The opaque mode's `grad_fn=` still reaches it.
    opaque = optax.contrib.sam(optax.sgd(0.1), optax.sgd(0.05), opaque_mode=True)
    opt = eqxopt.from_optax(opaque)
    grad_fn = jtu.Partial(lambda p, i: jax.tree.map(jnp.sign, p))
    updates, _ = opt.update(
        grads, opt.init(params), params, grad_fn=grad_fn, value=jnp.asarray(1.0)
    )
    assert jnp.allclose(updates["w"], -0.1 * jnp.ones(3))


def test_from_optax_lbfgs_in_minimize_and_in_a_compiled_loop():
    """`optax.lbfgs`'s state holds weakly typed scalars (its line-search info, from
    Python numbers) that its first update makes strong: `from_optax` drops the weak
    types, so the state keeps its type (no drift error at `init`, one compilation of
    a step). And its line search, which rejects extra arguments that `value_fn` does
    not take, runs in `eqxopt.minimize`, which also passes `obj_fn=` and `grad_fn=`."""
    opt = eqxopt.from_optax(optax.lbfgs())
    sol = eqxopt.minimize(_rosenbrock, opt, jnp.zeros(3), max_steps=100)
    assert jnp.allclose(sol.value, 1.0, atol=1e-5)

    # A value_fn's own extra arguments (Optax's convention) still reach it.
    def value_fn(y, scale):
        return scale * _rosenbrock(y, None)

    traces = []

    @eqx.filter_jit
    def step(y, state):
        traces.append(None)
        value, grad = jax.value_and_grad(value_fn)(y, 2.0)
        extra = dict(value=value, grad=grad, value_fn=value_fn, scale=2.0)
        return opt.step(y, grad, state, **extra, obj_fn=None)

    y, state = jnp.zeros(3), opt.init(jnp.zeros(3))
    for _ in range(30):
        y, state = step(y, state)
    assert len(traces) == 1 and jnp.allclose(y, 1.0, atol=1e-3)


def _rosenbrock(y, args):
    return jnp.sum(100.0 * (y[1:] - y[:-1] ** 2) ** 2 + (1.0 - y[:-1]) ** 2)
