"""The one drift check (dtype rule 5): any `update`, built in or a user's, that
returns a state of another structure/dtype/shape/weak type fails at trace time, naming
the leaf's path and both types."""

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import pytest
from jaxtyping import Array, Bool, TypeCheckError

import eqxopt
from eqxopt._core.base import describe

from .helpers import make_params


class FlagState(eqx.Module):
    found_nan: Bool[Array, "..."]


class DriftingFlag(eqxopt.AbstractOptimizer):
    """A user-written transform with Optax's old bug: the bool flag turns float."""

    def init(self, params):
        return FlagState(jnp.zeros((3,), bool))

    def update(self, grads, state, params=None, **extra):
        return grads, FlagState(state.found_nan.astype(jnp.float32))


class WeakCounter(eqxopt.AbstractOptimizer):
    def init(self, params):
        return eqxopt.CountState(jnp.zeros((), jnp.int32))

    def update(self, grads, state, params=None, **extra):
        # Bypass the typechecked constructor to return a weakly typed float counter.
        new = eqx.tree_at(lambda s: s.count, state, jnp.asarray(1.0))
        return grads, new


class GrowingState(eqxopt.AbstractOptimizer):
    def init(self, params):
        return (jnp.zeros((2,), jnp.float32),)

    def update(self, grads, state, params=None, **extra):
        return grads, (state[0], jnp.zeros((2,), jnp.float32))


def test_user_optimizer_drift_names_path_and_types():
    params = make_params()
    opt = DriftingFlag()
    with pytest.raises(
        eqxopt.StateDriftError, match=r"\.found_nan.*bool\[3\].*float32\[3\]"
    ):
        jax.jit(lambda s: opt.update(params, s, params))(opt.init(params))


def test_drift_error_is_a_type_error_with_attributes():
    params = make_params()
    opt = DriftingFlag()
    with pytest.raises(TypeError) as info:
        opt.update(params, opt.init(params), params)
    err = info.value
    assert isinstance(err, eqxopt.StateDriftError)
    assert err.path == ".found_nan"
    assert (err.expected, err.got) == ("bool[3]", "float32[3]")


def test_nested_drift_reports_full_path_even_through_cond():
    params = make_params()
    opt = eqxopt.Chain(eqxopt.Adam(1e-3), DriftingFlag())

    def step(state, flag):
        # Select the child's update through lax.cond, as MultiSteps does.
        return lax.cond(
            flag, lambda s: opt.update(params, s, params)[1], lambda s: s, state
        )

    with pytest.raises(eqxopt.StateDriftError) as info:
        jax.jit(step)(opt.init(params), True)
    assert info.value.path == "[1].found_nan"
    assert "DriftingFlag" in str(info.value)


def test_weak_type_drift_is_reported():
    params = make_params()
    opt = WeakCounter()
    with pytest.raises(eqxopt.StateDriftError, match=r"\.count.*int32\[\].*~float"):
        jax.jit(lambda s: opt.update(params, s, params))(opt.init(params))


def test_structure_drift_is_reported():
    params = make_params()
    opt = GrowingState()
    with pytest.raises(eqxopt.StateDriftError, match=r"\[1\].*absent"):
        opt.update(params, opt.init(params), params)


def test_check_can_be_switched_off(monkeypatch):
    params = make_params()
    opt = DriftingFlag()
    monkeypatch.setenv("EQXOPT_CHECK_STATE", "0")
    _, state = jax.jit(lambda s: opt.update(params, s, params))(opt.init(params))
    assert state.found_nan.dtype == jnp.float32


def test_verify_reports_every_leaf():
    params = make_params(jnp.bfloat16)
    report = eqxopt.verify(eqxopt.AdamW(1e-3), params, steps=2)
    paths = [leaf.path for leaf in report.leaves]
    assert paths[0] == ".count"
    assert ".mu['linear']['weight']" in paths
    assert all(leaf.dtype == "bfloat16" for leaf in report.leaves[1:])
    assert report.leaves[0].dtype == "int32"
    table = str(report)
    assert "state.mu['linear']['weight']" in table and "bfloat16" in table
    assert "(5, 3)" in table and "30" in table  # 15 bfloat16 elements = 30 bytes
    assert report.nbytes == 4 + 2 * 2 * (15 + 5 + 24 + 1)


def test_verify_raises_on_drift():
    with pytest.raises(eqxopt.StateDriftError, match="found_nan"):
        eqxopt.verify(DriftingFlag(), make_params())


def test_verify_rejects_weakly_typed_initial_state():
    class WeakInit(eqxopt.AbstractOptimizer):
        def init(self, params):
            return (jnp.asarray(0.0),)

        def update(self, grads, state, params=None, **extra):
            return grads, state

    with pytest.raises(eqxopt.StateDriftError, match=r"\[0\].*~float"):
        eqxopt.verify(WeakInit(), make_params())


# --- Structural paths: every wrapper composes its child's path (issue: `_locate`) ---


class BareCounter(eqxopt.AbstractOptimizer):
    """A user optimizer whose whole state is one int32 array that turns float."""

    def init(self, params):
        return jnp.zeros((), jnp.int32)

    def update(self, grads, state, params=None, **extra):
        return grads, state.astype(jnp.float32) + 1


class ModuleCounter(eqxopt.AbstractOptimizer):
    def init(self, params):
        return eqxopt.CountState(jnp.zeros((), jnp.int32))

    def update(self, grads, state, params=None, **extra):
        new = state.count.astype(jnp.float32) + 0.5
        return grads, eqx.tree_at(lambda s: s.count, state, new)


class DictCounter(eqxopt.AbstractOptimizer):
    def init(self, params):
        return {"n": jnp.zeros((), jnp.int32), "ok": jnp.zeros((), jnp.int32)}

    def update(self, grads, state, params=None, **extra):
        return grads, {"n": state["n"].astype(jnp.float32), "ok": state["ok"]}


# (child, the child's path inside its own state)
CHILDREN = {
    "bare": (BareCounter, ""),
    "module": (ModuleCounter, ".count"),
    "dict": (DictCounter, "['n']"),
}

# (wrapper around `child`, where the child's state sits in the wrapper's state)
WRAPPERS = {
    "chain": (lambda c: eqxopt.Chain(eqxopt.Scale(0.5), c), "[1]"),
    "partition": (
        lambda c: eqxopt.Partition(
            {"a": c, "b": eqxopt.SGD(0.1)}, {"w": "a", "b": "b"}
        ),
        ".inner_states['a']",
    ),
    "masked": (lambda c: eqxopt.Masked(c, True), ".inner_state"),
    "multisteps": (lambda c: eqxopt.MultiSteps(c, every_k=2), ".inner_state"),
    "apply_if_finite": (lambda c: eqxopt.ApplyIfFinite(c, 3), ".inner_state"),
    "lookahead": (lambda c: eqxopt.Lookahead(c, 2, 0.5), ".fast_state"),
    "schedule_free": (
        lambda c: eqxopt.ScheduleFree(c, learning_rate=0.1),
        ".inner_state",
    ),
    "params_ema": (lambda c: eqxopt.ParamsEMA(c, 0.9), ".inner_state"),
    "cautious": (lambda c: eqxopt.Cautious(c), ""),  # its state is the child's
    "mechanize": (lambda c: eqxopt.Mechanize(c), ".base_optimizer_state"),
    "split_real_and_imaginary": (
        lambda c: eqxopt.SplitRealAndImaginary(c),
        ".inner_state",
    ),
    "muon_fallback": (
        lambda c: eqxopt.Muon(0.02, fallback=c),  # "b" (1-D) goes to the fallback
        ".fallback_state",
    ),
    "galore": (
        lambda c: eqxopt.GaLore(1e-2, rank=1, base_optimizer=c),
        ".base_optimizer_state",
    ),
    "nested": (
        lambda c: eqxopt.MultiSteps(eqxopt.Chain(eqxopt.ZeroNans(), c), every_k=2),
        ".inner_state[1]",
    ),
}


@pytest.mark.parametrize("child", CHILDREN)
@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("method", ["update", "step"])
def test_drift_inside_every_wrapper_names_the_childs_own_leaf(wrapper, child, method):
    make_wrapper, prefix = WRAPPERS[wrapper]
    make_child, inner_path = CHILDREN[child]
    opt = make_wrapper(make_child())
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    grads = jax.tree.map(jnp.ones_like, params)
    if method == "update":
        run = lambda s: opt.update(grads, s, params)
    else:
        run = lambda s: opt.step(params, grads, s)
    with pytest.raises(eqxopt.StateDriftError) as info:
        jax.jit(run)(opt.init(params))
    assert info.value.path == prefix + inner_path
    assert info.value.culprit == make_child.__name__
    assert info.value.optimizer == type(opt).__name__
    assert info.value.expected == "int32[]" and info.value.got == "float32[]"
    assert str(info.value).startswith(f"`{type(opt).__name__}.{method}` returned")


def test_an_override_may_repair_the_state_super_returned():
    class Repaired(BareCounter):
        def update(self, grads, state, params=None, **extra):
            updates, state = super().update(grads, state, params, **extra)
            return updates, state.astype(jnp.int32)  # fixes the parent's drift

    params = {"w": jnp.ones(3)}
    opt = eqxopt.Chain(eqxopt.Scale(1.0), Repaired())
    state = opt.init(params)
    _, new = jax.jit(lambda s: opt.update(params, s, params))(state)
    assert new[1].dtype == jnp.int32 and new[1] == 1


def test_a_child_called_directly_is_still_reported_with_its_own_path():
    class Direct(eqxopt.AbstractOptimizer):  # does not use `child_update`
        inner: eqxopt.AbstractOptimizer

        def init(self, params):
            return {"x": self.inner.init(params)}

        def update(self, grads, state, params=None, **extra):
            updates, inner = self.inner.update(grads, state["x"], params)
            return updates, {"x": inner}

    params = {"w": jnp.ones(3)}
    opt = eqxopt.Chain(eqxopt.Scale(1.0), Direct(DictCounter()))
    with pytest.raises(eqxopt.StateDriftError) as info:
        opt.update(params, opt.init(params), params)
    # The path cannot be placed above `Direct`: it stays inside DictCounter's state.
    assert info.value.path == "['n']" and info.value.culprit == "DictCounter"


def test_a_weakly_typed_init_is_reported_as_inits():
    class WeakInit(eqxopt.AbstractOptimizer):
        def init(self, params):
            return {"n": jnp.asarray(0)}  # weakly typed

        def update(self, grads, state, params=None, **extra):
            return grads, state

    params = {"w": jnp.ones(3)}
    with pytest.raises(eqxopt.StateDriftError, match=r"`WeakInit\.init`") as info:
        eqxopt.MultiSteps(WeakInit(), 2).init(params)
    assert info.value.method == "init" and info.value.path == "['n']"
    assert info.value.got.startswith("~int") and "update" not in str(info.value)[:40]


def test_typed_key_leaves_are_described():
    key = jax.random.key(0)
    assert describe(key) == "key<fry>[]"

    class KeyState(eqxopt.AbstractOptimizer):
        def init(self, params):
            return {"key": jax.random.key(0)}

        def update(self, grads, state, params=None, **extra):
            return grads, {"key": jax.random.split(state["key"])[0]}

    params = {"w": jnp.ones(3)}
    opt = eqxopt.Chain(eqxopt.Scale(1.0), KeyState())
    eqxopt.verify(opt, params)  # no drift, and the report can describe keys
    assert "key<fry>" in str(eqxopt.verify(opt, params))


# --- Arguments in the wrong order, or of the wrong shape ---------------------------


def test_state_passed_as_grads_says_so():
    params = {"w": jnp.ones(3)}
    opt = eqxopt.Adam(1e-3)
    state = opt.init(params)
    with pytest.raises(TypeError, match=r"got a `AdamState` as `grads`.*wrong order"):
        opt.update(state, params, params)  # pyright: ignore


def test_grads_passed_as_state_says_so():
    params = {"w": jnp.ones(3)}
    opt = eqxopt.Chain(eqxopt.Adam(1e-3))
    with pytest.raises(TypeError, match=r"expects as `state` a `tuple`.*got a `dict`"):
        opt.update(params, params, params)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match=r"`AdamState`.*got a `dict`"):
        eqxopt.Adam(1e-3).update(params, params, params)  # pyright: ignore[reportArgumentType]


def test_model_and_grads_swapped_in_step_says_so():
    # A model's functions (here `jax.nn.relu`) would have been replaced by `None`.
    model = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0))
    grads = jax.tree.map(jnp.ones_like, eqx.filter(model, eqx.is_inexact_array))
    opt = eqxopt.Adam(1e-2)
    state = opt.init(model)
    with pytest.raises(TypeError, match=r"at `grads\.activation`.*wrong order"):
        opt.step(grads, model, state)
    model, _ = opt.step(model, grads, state)  # the right order
    assert callable(model.activation)


def test_a_float_gradient_for_an_integer_param_names_the_leaf():
    params = {"w": jnp.arange(3), "b": jnp.zeros(2)}
    opt = eqxopt.Adam(1e-2)
    grads = {"w": jnp.ones(3), "b": jnp.ones(2)}
    with pytest.raises(
        ValueError, match=r"`grads\['w'\]` is a float.*`params\['w'\]` is"
    ):
        opt.step(params, grads, opt.init(params))
    # None for it, as `eqx.filter_grad` gives, is the way:
    new, _ = opt.step(params, {"w": None, "b": jnp.ones(2)}, opt.init(params))
    assert new["w"] is params["w"]


def test_state_of_another_dtype_than_the_model_says_so():
    opt = eqxopt.Adam(1e-2)
    state = opt.init({"w": jnp.ones(3, jnp.float32)})
    model16 = {"w": jnp.ones(3, jnp.bfloat16)}
    grads16 = {"w": jnp.ones(3, jnp.bfloat16)}
    with pytest.raises(ValueError, match=r"`state\.mu\['w'\]` is float32.*bfloat16"):
        opt.step(model16, grads16, state)
    # With `state_dtype` the float32 state is what was asked for.
    opt32 = eqxopt.Adam(1e-2, state_dtype=jnp.float32)
    model, state = opt32.step(model16, grads16, opt32.init(model16))
    assert state.mu["w"].dtype == jnp.float32 and model["w"].dtype == jnp.bfloat16


def test_a_state_of_the_wrong_class_is_named_without_suggesting_a_cast():
    class DictState(eqxopt.AbstractOptimizer):
        def init(self, params):
            return eqxopt.Adam(1e-2).init(params)

        def update(self, grads, state, params=None, **extra):
            updates, s = eqxopt.Adam(1e-2).update(grads, state, params)
            return updates, {"count": s.count, "mu": s.mu, "nu": s.nu}

    params = {"w": jnp.ones(3)}
    with pytest.raises(eqxopt.StateDriftError) as info:
        DictState().update(params, DictState().init(params), params)
    message = str(info.value)
    assert "it was an `AdamState`, it came back a `dict`" in message
    assert "astype" not in message and "same state class" in message


def test_wrong_shape_grads_name_the_leaf():
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    opt = eqxopt.Adam(1e-3)
    state = opt.init(params)
    bad = {"w": jnp.ones((3,)), "b": jnp.zeros(3)}
    with pytest.raises(ValueError, match=r"`grads\['w'\]` has shape \(3,\).*\(2, 3\)"):
        opt.update(bad, state, params)
    with pytest.raises(ValueError, match=r"`grads\['w'\]` has shape \(3,\).*\(2, 3\)"):
        opt.update(bad, state)  # no params: checked against the state's buffers


def test_state_annotations_are_checked_at_every_construction():
    # The verdict for an abstract signature (tree structure, leaf types, shapes and
    # dtypes) is remembered once it passed; any other signature is checked in full.
    mu = {"w": jnp.zeros((2, 3), jnp.float32), "b": jnp.zeros((3,), jnp.float32)}
    count = jnp.zeros((), jnp.int32)
    for _ in range(2):  # the second construction takes the remembered verdict
        eqxopt.AdamState(count, mu, mu)
    jax.jit(lambda c, m: eqxopt.AdamState(c, m, m))(count, mu)  # tracers: checked
    bad_leaf = dict(mu, b=jnp.zeros((3,), jnp.int32))  # not inexact
    bad_count = count.astype(jnp.float32)
    for _ in range(2):  # a failure is never remembered as a pass
        with pytest.raises(TypeCheckError, match="Type-check error"):
            eqxopt.AdamState(count, bad_leaf, mu)
        with pytest.raises(TypeCheckError, match="Type-check error"):
            jax.jit(lambda c, m: eqxopt.AdamState(c, m, m))(bad_count, mu)
    with pytest.raises(TypeCheckError, match="Type-check error"):  # a new structure
        eqxopt.AdamState(count, [bad_leaf["b"]], mu)
