"""Bad input gets a clear error naming the problem."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt

from .helpers import CASES, make_params, random_like


BAD = [(case.id, make, field) for case in CASES for make, field in case.bad]


@pytest.mark.parametrize(
    "case_id, make, field", BAD, ids=[f"{c}-{f}" for c, _, f in BAD]
)
def test_bad_hyperparameter_raises_value_error_naming_field(case_id, make, field):
    """The registry's `Case.bad`: each construction raises naming its field."""
    with pytest.raises(ValueError, match=rf"\({field}=\.\.\.\)"):
        make()


def test_every_named_optimizer_has_bad_input_cases():
    assert len(BAD) >= 120


def test_chain_rejects_non_optimizers():
    with pytest.raises(ValueError, match="argument 1"):
        eqxopt.Chain(eqxopt.Adam(1e-3), lambda g: g)  # pyright: ignore


def test_mismatched_grads_raise_clear_error_at_trace_time():
    params = make_params()
    opt = eqxopt.Adam(1e-3)
    state = opt.init(params)
    grads = random_like(jax.random.key(0), params)
    del grads["conv"]
    with pytest.raises(ValueError, match=r"same tree structure.*\['conv'\]"):
        opt.update(grads, state, params)


def test_mismatched_mask_raises_clear_error():
    params = make_params()
    opt = eqxopt.AdamW(1e-3, mask={"linear": True, "other": False})
    state = opt.init(params)
    with pytest.raises(ValueError, match="PyTree prefix of the params"):
        opt.update(params, state, params)


def test_adamw_without_params_is_an_error():
    params = {"w": jnp.ones((2,), jnp.float32)}
    opt = eqxopt.AdamW(1e-3)
    with pytest.raises(ValueError, match="needs `params`"):
        opt.update(params, opt.init(params))


# --- design.md#protocol: what a scalar hyperparameter may be, whatever its type ------

NOT_A_HYPERPARAMETER = [
    (lambda: eqxopt.Adam(jnp.asarray(-1e-3)), "learning_rate", ">= 0"),  # ascends
    (lambda: eqxopt.Adam(np.float32(-1e-3)), "learning_rate", ">= 0"),
    (lambda: eqxopt.Adam(1e-3, b1=jnp.asarray(1.0)), "b1", r"in \[0, 1\)"),
    (lambda: eqxopt.Adam(jnp.asarray([1e-3, 1e-2])), "learning_rate", "shape"),
    (lambda: eqxopt.Adam(np.ones((1,))), "learning_rate", "shape"),
    (lambda: eqxopt.Adam("1e-3"), "learning_rate", "real scalar"),  # pyright: ignore
    (lambda: eqxopt.SGD("0.1"), "learning_rate", "real scalar"),  # pyright: ignore
    (lambda: eqxopt.Adam(1e-3, b1="0.9"), "b1", "real scalar"),  # pyright: ignore
    (lambda: eqxopt.Adam(None), "learning_rate", "real scalar"),  # pyright: ignore
    (lambda: eqxopt.Adam(1e-3 + 1j), "learning_rate", "real scalar"),  # pyright: ignore
    (lambda: eqxopt.Adam(True), "learning_rate", "real scalar"),
    (lambda: eqxopt.Adam(float("nan")), "learning_rate", ">= 0"),
    (
        lambda: eqxopt.schedules.WarmupCosineDecay(0, -1e-2, 10, 100),
        "peak_value",
        ">= 0",
    ),
    (
        lambda: eqxopt.schedules.Constant("1e-3"),  # pyright: ignore
        "value",
        "real scalar",
    ),
    (lambda: eqxopt.MultiSteps(eqxopt.SGD(0.1), lambda c: 0), "every_k", "giving 0"),
    (lambda: eqxopt.MultiSteps(eqxopt.SGD(0.1), lambda c: -3), "every_k", "giving -3"),
    (
        lambda: eqxopt.MultiSteps(eqxopt.SGD(0.1), lambda c: 2.5),
        "every_k",
        "giving 2.5",
    ),
    (lambda: eqxopt.MultiSteps(eqxopt.SGD(0.1), 2.5), "every_k", "integer >= 1"),
]


@pytest.mark.parametrize("make, field, rule", NOT_A_HYPERPARAMETER)
def test_invalid_hyperparameter_of_any_type_names_the_field(make, field, rule):
    with pytest.raises(ValueError, match=rf"\({field}=\.\.\.\)` must .*{rule}"):
        make()


def test_traced_hyperparameters_and_schedules_pass_construction():
    params = {"w": jnp.ones(3)}

    @jax.jit
    def run(lr):
        opt = eqxopt.Adam(lr)  # a tracer: checked nowhere, leaks nowhere
        return opt.update(params, opt.init(params), params)[0]

    run(jnp.asarray(1e-3))
    eqxopt.Adam(eqxopt.schedules.Constant(1e-3))
    eqxopt.MultiSteps(eqxopt.SGD(0.1), eqxopt.schedules.Constant(2.0))


def test_every_k_schedule_is_checked_where_its_value_is_concrete():
    class Late(eqxopt.schedules.AbstractSchedule):  # fine at 0, zero later
        def __call__(self, count):
            return jnp.where(jnp.asarray(count) < 1, 2, 0)

    params = {"w": jnp.ones(3)}
    opt = eqxopt.MultiSteps(eqxopt.SGD(0.1), Late())
    state = opt.init(params)
    for _ in range(2):  # the first window: every_k = 2
        params, state = opt.step(params, params, state)
    with pytest.raises(ValueError, match=r"every_k=.*giving"):
        opt.step(params, params, state)  # eager: the value 0 is concrete


@pytest.mark.parametrize(
    "opt",
    [
        eqxopt.Lamb(1e-3),
        eqxopt.Lars(0.1),
        eqxopt.Adafactor(),
        eqxopt.ScaleByTrustRatio(),
        eqxopt.Novograd(1e-2, weight_decay=1e-3),
        eqxopt.Lion(1e-3),
        eqxopt.AdamaxW(1e-3),
        eqxopt.NAdamW(1e-3),
    ],
    ids=lambda o: type(o).__name__,
)
def test_missing_params_is_a_clear_error(opt):
    params = {"w": jnp.ones((3, 2), jnp.float32)}
    with pytest.raises(ValueError, match="params"):
        opt.update(params, opt.init(params))


@pytest.mark.parametrize(
    "opt, name",
    [
        (eqxopt.ReduceOnPlateau(), "value"),
        (eqxopt.Chain(eqxopt.Adam(1e-3), eqxopt.ReduceOnPlateau()), "value"),
        (eqxopt.SAM(eqxopt.SGD(0.1), eqxopt.SGD(0.1), opaque_mode=True), "grad_fn"),
        (eqxopt.Sophia(1e-3), "obj_fn"),
        (eqxopt.HutchinsonEstimatorDiagHessian(), "obj_fn"),
    ],
    ids=["plateau", "chain_plateau", "sam_opaque", "sophia", "hutchinson"],
)
def test_missing_extra_argument_is_named_at_trace_time(opt, name):
    params = make_params()
    state = opt.init(params)
    step = eqx.filter_jit(lambda g, s, p: opt.update(g, s, p))
    with pytest.raises(ValueError, match=f"`{name}=`"):
        step(params, state, params)
