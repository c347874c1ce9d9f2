"""Muon: against a NumPy transcription of the reference algorithm, against Optax where
the two agree by design, under `jit`/`shard_map`/`NamedSharding`, on real Equinox
layers, its fallback routing, and its errors. (Dtype/scan/trace-once properties and
the step-by-step Optax parity come from tests/registry/matrix.py.)"""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import eqxopt
from eqxopt._matrix import muon as muon_module
from eqxopt._misc import is_none

from .helpers import random_like, tree_allclose
from .test_matrix_sharding import computations


DEFAULT = ((3.4445, -4.7750, 2.0315),) * 5
# Per-step coefficients (Dion's schedule, as listed in optax.contrib._muon).
PER_STEP = (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
)


# --- the reference algorithm, in plain NumPy ------------------------------------------


def np_orthogonalize(v, coeffs, eps):
    """Keller Jordan's `zeropower_via_newtonschulz5`, in float64."""
    tall = v.shape[0] > v.shape[1]
    x = v.T if tall else v
    x = x / (np.linalg.norm(x) + eps)
    for a, b, c in coeffs:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def np_muon(params, grads_seq, *, lr, momentum, nesterov, coeffs, eps, wd, rule):
    """Reference Muon on a dict of (out, in) matrices: returns (params, momentum)."""
    params = {k: np.asarray(v, np.float64) for k, v in params.items()}
    mom = {k: np.zeros_like(v) for k, v in params.items()}
    for grads in grads_seq:
        for k, p in params.items():
            g = np.asarray(grads[k], np.float64)
            mom[k] = momentum * mom[k] + (1 - momentum) * g  # momentum.lerp_(g, 1-mu)
            v = (1 - momentum) * g + momentum * mom[k] if nesterov else mom[k]
            o = np_orthogonalize(v, coeffs, eps)
            n_out, n_in = p.shape
            if rule == "reference":
                s = max(1.0, n_out / n_in) ** 0.5
            else:
                s = 0.2 * max(n_out, n_in) ** 0.5
            params[k] = p * (1 - lr * wd) - lr * s * o  # p.mul_(1-lr*wd); p.add_(...)
    return params, mom


# Wide, tall, square; (3, 7) and (7, 3) share one batched Newton-Schulz.
SHAPES = {"wide": (3, 7), "tall": (7, 3), "tall2": (9, 4), "square": (5, 5)}


@pytest.mark.parametrize(
    "rule, nesterov, coeffs, wd, batched",
    [
        ("reference", True, DEFAULT, 0.0, False),
        ("adamw_rms", True, DEFAULT, 0.05, True),
        ("reference", True, PER_STEP, 0.1, True),
        ("adamw_rms", False, PER_STEP, 0.0, False),
    ],
)
def test_matches_numpy_reference(rule, nesterov, coeffs, wd, batched, monkeypatch):
    # Same-shape matrices share one batched Newton-Schulz on accelerators, not on
    # CPU: force each choice.
    monkeypatch.setattr(muon_module, "_GROUP_SAME_SHAPES", batched)
    keys = jr.split(jr.key(0), len(SHAPES))
    params = {
        k: jr.normal(key, s, jnp.float64) for key, (k, s) in zip(keys, SHAPES.items())
    }
    grads_seq = [random_like(jr.key(i + 1), params) for i in range(4)]
    opt = eqxopt.Muon(
        0.05,
        momentum=0.9,
        nesterov=nesterov,
        ns_coeffs=coeffs[0] if coeffs is DEFAULT else coeffs,
        eps=1e-7,
        weight_decay=wd,
        scale_rule=rule,
    )
    state = opt.init(params)
    assert state.ns_coeffs.shape == (5, 3) and state.ns_coeffs.dtype == jnp.float64
    step = eqx.filter_jit(opt.step)
    p = params
    for grads in grads_seq:
        p, state = step(p, grads, state)
    want_p, want_m = np_muon(
        params,
        grads_seq,
        lr=0.05,
        momentum=0.9,
        nesterov=nesterov,
        coeffs=coeffs,
        eps=1e-7,
        wd=wd,
        rule=rule,
    )
    for k in SHAPES:
        np.testing.assert_allclose(p[k], want_p[k], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(state.mu[k], want_m[k], rtol=1e-12, atol=1e-14)
    assert int(state.count) == 4


def test_float32_and_bfloat16_newton_schulz_close_to_reference():
    params = {"w": jr.normal(jr.key(0), (6, 10), jnp.float32)}
    grads = random_like(jr.key(1), params)
    want, _ = np_muon(
        params,
        [grads],
        lr=1.0,
        momentum=0.95,
        nesterov=True,
        coeffs=DEFAULT,
        eps=1e-7,
        wd=0.0,
        rule="reference",
    )
    want_update = want["w"] - np.asarray(params["w"], np.float64)
    for ns_dtype, rtol in ((None, 1e-5), (jnp.bfloat16, 5e-2)):
        opt = eqxopt.Muon(1.0, ns_dtype=ns_dtype)
        updates, _ = jax.jit(opt.update)(grads, opt.init(params), params)
        assert updates["w"].dtype == jnp.float32
        # bfloat16 has 8 significant bits: compare relative to the update's norm.
        err = np.linalg.norm(np.asarray(updates["w"], np.float64) - want_update)
        assert err <= rtol * np.linalg.norm(want_update), (ns_dtype, err)


def _layout_changes(hlo: str) -> list[str]:
    """The instructions of a compiled program's text that move data between layouts:
    every `transpose`, and every `copy` to a layout other than its operand's."""
    found = []
    for lines in computations(hlo)[0].values():
        layouts = {}
        for line in lines:
            m = _HLO_LINE.match(line)
            if m is None:
                continue
            name, layout, op, operand = m.groups()
            layouts[name] = layout
            if op == "transpose" or (op == "copy" and layouts.get(operand) != layout):
                found.append(line.strip())
    return found


_HLO_LINE = re.compile(
    r"\s+(?:ROOT )?(%[\w.\-]+) = \w+\[[\d,]*\](\{[\d,]*\})? ([\w\-]+)\((%[\w.\-]+)?"
)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's layouts")
@pytest.mark.parametrize("make", [eqxopt.Muon, eqxopt.NorMuon])
def test_newton_schulz_compiles_without_transposes_on_cpu(make):
    # On CPU each leaf has its own Newton-Schulz: a tall matrix in the tall form, one
    # matrix in 2-D products. Transposing it, or a batched product's transposed
    # operand, would be a copy kernel per shape, slow to compile.
    params = {"tall": jnp.ones((48, 16)), "wide": jnp.ones((16, 48)), "b": jnp.ones(16)}
    opt = make(0.02)
    step = jax.jit(lambda p, s, g: opt.update(g, s, p))
    hlo = step.lower(params, opt.init(params), params).compile().as_text()
    assert hlo is not None
    assert _layout_changes(hlo) == []


# --- against optax.contrib.muon -------------------------------------------------------
# Step-by-step parity on the shared param tree is in tests/registry/matrix.py (without
# Nesterov, layout passed as dimension numbers). They cannot agree with Nesterov:
# Optax's look-ahead mu * m/(1-mu^(k+1)) + (1-mu) * g/(1-mu^k) weights momentum and
# gradient differently from the reference's mu * m + (1-mu) * g.


def _optax_muon(lr, **kwargs):
    return optax.contrib.muon(
        lr, beta=0.9, eps=1e-8, nesterov=False, adam_weight_decay=0.0, **kwargs
    )


def test_optax_default_layout_is_the_transpose():
    # Optax's default dimension numbers assume Flax's (in, out) kernels: given the
    # transposed weights it computes our update, transposed (scale included).
    w = jr.normal(jr.key(0), (4, 9), jnp.float64)  # (out, in), wide
    v = jr.normal(jr.key(1), (8, 3), jnp.float64)  # (out, in), tall
    params = {"w": w, "v": v}
    grads_seq = [random_like(jr.key(i), params) for i in range(3)]
    ours = eqxopt.Muon(0.1, momentum=0.9, nesterov=False, eps=1e-8, weight_decay=0.02)
    ref = _optax_muon(0.1, weight_decay=0.02)
    s_ours, s_ref = ours.init(params), ref.init(jtu.tree_map(jnp.transpose, params))
    p_ours, p_ref = params, jtu.tree_map(jnp.transpose, params)
    ours_step, ref_update = jax.jit(ours.step), jax.jit(ref.update)
    for grads in grads_seq:
        p_ours, s_ours = ours_step(p_ours, grads, s_ours)
        with jax.numpy_dtype_promotion("standard"):  # Optax is not strict-clean
            u, s_ref = ref_update(jtu.tree_map(jnp.transpose, grads), s_ref, p_ref)
        p_ref = optax.apply_updates(p_ref, u)
    # Optax bias-corrects the momentum; eps makes that visible at ~1e-8.
    assert tree_allclose(p_ours, jtu.tree_map(jnp.transpose, p_ref), rtol=1e-7)


def test_conv_kernel_dimension_numbers_match_optax():
    # A (out, in, kh, kw) kernel flattened to (out, in*kh*kw), as the reference does
    # for conv filters; Optax's dimension numbers name the same axes. Plus stacked
    # (heads, out, in) weights with the default `True`: one matrix per head.
    params = {
        "conv": jr.normal(jr.key(0), (6, 2, 3, 3), jnp.float64),
        "heads": jr.normal(jr.key(1), (3, 4, 5), jnp.float64),
    }
    conv_dims = eqxopt.MuonDimensionNumbers(reduction_axis=(1, 2, 3), output_axis=0)
    ours = eqxopt.Muon(
        0.1,
        momentum=0.9,
        nesterov=False,
        eps=1e-8,
        matrix_mask={"conv": conv_dims, "heads": True},
    )
    ref = _optax_muon(
        0.1,
        muon_weight_dimension_numbers={
            "conv": optax.contrib.MuonDimensionNumbers((1, 2, 3), 0),
            "heads": optax.contrib.MuonDimensionNumbers(2, 1),
        },
    )
    s_ours, s_ref = ours.init(params), ref.init(params)
    p_ours = p_ref = params
    ours_step, ref_update = eqx.filter_jit(ours.step), jax.jit(ref.update)
    for i in range(3):
        grads = random_like(jr.key(10 + i), params)
        p_ours, s_ours = ours_step(p_ours, grads, s_ours)
        with jax.numpy_dtype_promotion("standard"):
            u, s_ref = ref_update(grads, s_ref, p_ref)
        p_ref = optax.apply_updates(p_ref, u)
    assert tree_allclose(p_ours, p_ref, rtol=1e-7)  # bias correction vs eps, as above


# --- Equinox layers: the (out, in) scale ----------------------------------------------


@pytest.mark.parametrize("rule", ["reference", "adamw_rms"])
def test_eqx_linear_gets_out_in_scale(rule):
    # eqx.nn.Linear(3, 5).weight has shape (5, 3): out=5, in=3.
    lin = eqx.nn.Linear(3, 5, use_bias=False, key=jr.key(0), dtype=jnp.float64)
    assert lin.weight.shape == (5, 3)
    g = jr.normal(jr.key(1), (5, 3), jnp.float64)
    opt = eqxopt.Muon(1.0, momentum=0.0, nesterov=False, scale_rule=rule)
    grads = eqx.tree_at(lambda m: m.weight, lin, g)
    update = eqx.filter_jit(opt.update)
    updates, _ = update(grads, opt.init(lin), lin)
    want_scale = np.sqrt(5 / 3) if rule == "reference" else 0.2 * np.sqrt(5)
    np.testing.assert_allclose(
        updates.weight, -want_scale * np_orthogonalize(np.asarray(g), DEFAULT, 1e-7)
    )
    # The same matrix as a Linear(5, 3) weight, transposed: (out, in) = (3, 5).
    lin_t = eqx.nn.Linear(5, 3, use_bias=False, key=jr.key(0), dtype=jnp.float64)
    grads_t = eqx.tree_at(lambda m: m.weight, lin_t, g.T)
    updates_t, _ = update(grads_t, opt.init(lin_t), lin_t)
    want_scale_t = 1.0 if rule == "reference" else 0.2 * np.sqrt(5)
    np.testing.assert_allclose(
        updates.weight / want_scale, updates_t.weight.T / want_scale_t, rtol=1e-12
    )


# --- routing and the fallback ---------------------------------------------------------


def _mlp():
    return eqx.nn.MLP(4, 3, 8, 2, key=jr.key(0), dtype=jnp.float64)


def _loss(model, x):
    return jnp.mean(jax.vmap(model)(x) ** 2)


@pytest.mark.parametrize("custom", [False, True])
def test_fallback_leaves_equal_fallback_alone(custom):
    model = _mlp()
    fallback = eqxopt.SGD(0.05, momentum=0.9) if custom else None
    opt = eqxopt.Muon(0.02, weight_decay=0.1, fallback=fallback)
    alone = fallback if custom else eqxopt.AdamW(0.02, weight_decay=0.1)
    assert alone is not None
    is_vector = lambda x: eqx.is_inexact_array(x) and x.ndim != 2
    state = opt.init(model)
    vectors = eqx.filter(model, is_vector)
    alone_state = alone.init(vectors)
    x = jr.normal(jr.key(1), (16, 4), jnp.float64)

    @eqx.filter_jit
    def step(model, state, vectors, alone_state):
        grads = eqx.filter_grad(_loss)(model, x)
        model, state = opt.step(model, grads, state)
        vectors, alone_state = alone.step(
            vectors, eqx.filter(grads, is_vector), alone_state
        )
        return model, state, vectors, alone_state

    for _ in range(3):
        model, state, vectors, alone_state = step(model, state, vectors, alone_state)
    assert tree_allclose(eqx.filter(model, is_vector), vectors, rtol=1e-12)
    # Matrices went to Muon (momentum buffers), vectors to the fallback.
    assert state.mu.layers[0].weight.shape == (8, 4) and state.mu.layers[0].bias is None
    hp = opt.hyperparams(state)
    assert hp["weight_decay"] == 0.1 and "fallback" in hp


def test_mask_routes_head_to_fallback_and_trains_in_a_train_state():
    model = _mlp()
    # The output head (last layer) goes to AdamW: a tree-shaped filter spec.
    mask = jtu.tree_map(lambda x: eqx.is_inexact_array(x) and x.ndim == 2, model)
    mask = eqx.tree_at(lambda m: m.layers[-1].weight, mask, False)
    opt = eqxopt.Muon(0.02, matrix_mask=mask)

    class TrainState(eqx.Module):
        model: eqx.nn.MLP
        opt: eqxopt.Muon
        opt_state: eqxopt.MuonState

    ts = TrainState(model, opt, opt.init(model))
    assert ts.opt_state.mu.layers[-1].weight is None
    assert ts.opt_state.fallback_state.mu.layers[-1].weight.shape == (3, 8)
    x = jr.normal(jr.key(1), (32, 4), jnp.float64)

    @eqx.filter_jit(donate="all-except-first")
    def train_step(x, ts):
        loss, grads = eqx.filter_value_and_grad(_loss)(ts.model, x)
        model, opt_state = ts.opt.step(ts.model, grads, ts.opt_state)
        return eqx.tree_at(
            lambda t: (t.model, t.opt_state), ts, (model, opt_state)
        ), loss

    losses = []
    for _ in range(30):
        ts, loss = train_step(x, ts)
        losses.append(float(loss))
    assert losses[-1] < 0.2 * losses[0]


# --- jit, shard_map, NamedSharding ----------------------------------------------------


def test_built_in_one_jit_used_in_another():
    built = []

    @jax.jit
    def build(lr):
        # Per-step coefficients: the case where `jnp.asarray(ns_coeffs)` at
        # construction leaked a tracer in Optax.
        built.append(eqxopt.Muon(0.02, ns_coeffs=PER_STEP, weight_decay=0.01))
        return lr

    build(1.0)
    opt = built[0]
    assert not any(isinstance(x, jax.Array) for x in jtu.tree_leaves(opt))
    model = _mlp()
    grads = eqx.filter_grad(_loss)(model, jnp.ones((2, 4), jnp.float64))
    state = eqx.filter_jit(opt.init)(model)
    eqx.filter_jit(opt.step)(model, grads, state)  # no UnexpectedTracerError


def _data_parallel_params():
    keys = jr.split(jr.key(0), 3)
    return {
        "w1": jr.normal(keys[0], (16, 8), jnp.float64) / 4,
        "b1": jnp.zeros((16,), jnp.float64),
        "w2": jr.normal(keys[1], (4, 16), jnp.float64) / 4,
    }


def _mlp_loss(params, x, y):
    h = jnp.tanh(x @ params["w1"].T + params["b1"])
    return jnp.mean((h @ params["w2"].T - y) ** 2)


@pytest.mark.parametrize("check_vma", [False, True])
def test_shard_map_data_parallel_equals_single_device(check_vma):
    mesh = jax.make_mesh((8,), ("data",))
    params = _data_parallel_params()
    x = jr.normal(jr.key(1), (64, 8), jnp.float64)
    y = jr.normal(jr.key(2), (64, 4), jnp.float64)
    batch = NamedSharding(mesh, P("data"))
    xs, ys = jax.device_put(x, batch), jax.device_put(y, batch)
    make = lambda: eqxopt.Muon(0.05, ns_coeffs=PER_STEP, weight_decay=0.01)
    state = make().init(params)

    def body(params, state, x, y):
        opt = make()  # built inside the shard_map trace
        if check_vma:
            # With replication checking, the gradient of replicated params is summed
            # over devices by the transpose itself: differentiate the mean loss.
            loss = lambda p: jax.lax.pmean(_mlp_loss(p, x, y), "data")
            grads = jax.grad(loss)(params)
        else:
            # The classic recipe: per-device gradients, averaged with `pmean`.
            grads = jax.lax.pmean(jax.grad(_mlp_loss)(params, x, y), "data")
        return opt.step(params, grads, state)

    sharded = jax.jit(
        jax.shard_map(
            body,
            mesh=mesh,
            in_specs=(P(), P(), P("data"), P("data")),
            out_specs=(P(), P()),
            check_vma=check_vma,
        )
    )

    @jax.jit
    def single(params, state, x, y):
        return make().step(params, jax.grad(_mlp_loss)(params, x, y), state)

    p1, s1, p2, s2 = params, state, params, state
    for _ in range(3):
        p1, s1 = sharded(p1, s1, xs, ys)
        p2, s2 = single(p2, s2, x, y)
    assert tree_allclose((p1, s1), (p2, s2), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("axis_type", ["auto", "explicit"])
def test_named_sharding_update_equals_unsharded_and_state_stays_sharded(axis_type):
    # GSPMD (automatic axes) and sharding-in-types (explicit axes, jax's default).
    types = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}[axis_type]
    mesh = jax.make_mesh(
        (4,), ("model",), devices=jax.devices()[:4], axis_types=(types,)
    )
    params = _data_parallel_params()
    shardings = {  # one matrix split along each axis
        "w1": NamedSharding(mesh, P("model", None)),
        "w2": NamedSharding(mesh, P(None, "model")),
        "b1": NamedSharding(mesh, P("model")),
    }
    sharded_params = jax.device_put(params, shardings)
    grads = random_like(jr.key(3), params)
    sharded_grads = jax.device_put(grads, shardings)
    opt = eqxopt.Muon(0.05, weight_decay=0.01)
    update = jax.jit(opt.update)
    state = jax.jit(opt.init)(sharded_params)
    ref_state = opt.init(params)
    u = None
    for _ in range(2):
        u, state = update(sharded_grads, state, sharded_params)
        u_ref, ref_state = update(grads, ref_state, params)
        assert tree_allclose(u, u_ref, rtol=1e-10, atol=1e-13)
    assert u is not None
    for k, sharding in shardings.items():
        ndim = params[k].ndim
        assert u[k].sharding.is_equivalent_to(sharding, ndim), (k, u[k].sharding)
        fb = state.fallback_state
        buffers = [state.mu[k]] if ndim == 2 else [fb.mu[k], fb.nu[k]]
        for buf in buffers:
            assert buf.sharding.is_equivalent_to(sharding, ndim), (k, buf.sharding)


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"scale_rule": "bogus"}, "scale_rule"),
        ({"ns_coeffs": PER_STEP[:3]}, "ns_coeffs"),
        ({"ns_coeffs": (1.0, 2.0)}, "ns_coeffs"),
        ({"ns_steps": 0}, "ns_steps"),
        ({"momentum": 1.0}, "momentum"),
        ({"eps": -1.0}, "eps"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"ns_dtype": jnp.int32}, "ns_dtype"),
        ({"fallback": optax.adam(1e-3)}, "fallback"),
    ],
)
def test_bad_options_raise_value_error_naming_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"\({field}=\.\.\.\)"):
        eqxopt.Muon(0.02, **kwargs)


def test_negative_learning_rate_raises():
    with pytest.raises(ValueError, match=r"\(learning_rate=\.\.\.\)"):
        eqxopt.Muon(-0.02)


def test_bad_matrix_selection_raises_at_init():
    params = {"w": jnp.zeros((3, 4)), "b": jnp.zeros((3,))}
    with pytest.raises(ValueError, match=r"\['b'\].*rank >= 2"):
        eqxopt.Muon(0.02, matrix_mask=True).init(params)
    overlapping = eqxopt.MuonDimensionNumbers(reduction_axis=(0, 1), output_axis=1)
    with pytest.raises(ValueError, match="disjoint"):
        eqxopt.Muon(0.02, matrix_mask={"w": overlapping, "b": False}).init(params)
    with pytest.raises(ValueError, match="reduction_axis"):
        eqxopt.MuonDimensionNumbers(reduction_axis=())


def test_update_without_params_raises_unless_nothing_needs_them():
    params = {"w": jnp.ones((3, 4)), "b": jnp.ones((3,))}
    grads = random_like(jr.key(0), params)
    opt = eqxopt.Muon(0.02)
    with pytest.raises(ValueError, match="needs `params`"):
        opt.update(grads, opt.init(params))
    # No weight decay and a fallback that needs no params: `params` may be omitted.
    opt = eqxopt.Muon(0.02, fallback=eqxopt.SGD(0.1))
    updates, _ = opt.update(grads, opt.init(params))
    assert updates["w"].shape == (3, 4) and updates["b"].shape == (3,)


# --- issue 14: a bare matrix, routing through Partition's resolver, child_update -----


@pytest.mark.parametrize("make", [eqxopt.Muon, eqxopt.NorMuon])
def test_params_that_are_one_matrix(make):
    # No leaf goes to the fallback: it is not called (it used to be called with
    # `params=None` and raise "AdamW.update needs params for the weight decay").
    opt = make(1e-2, weight_decay=0.1)
    p = jnp.full((2, 3), 0.5)
    g = jnp.arange(6.0).reshape(2, 3)
    updates, state = opt.update(g, opt.init(p), p)
    want, _ = opt.update({"w": g}, opt.init({"w": p}), {"w": p})
    np.testing.assert_allclose(updates, want["w"], rtol=1e-12)
    assert state.fallback_state == opt.init(p).fallback_state  # untouched
    # A bare 1-D array goes to the fallback alone.
    v = jnp.ones(3)
    updates, _ = opt.update(v, opt.init(v), v)
    fb, _ = eqxopt.AdamW(1e-2, weight_decay=0.1).update(
        v, eqxopt.AdamW(1e-2, weight_decay=0.1).init(v), v
    )
    np.testing.assert_allclose(updates, fb, rtol=1e-12)


def test_routing_resolves_masks_as_partition_does():
    # Muon routes with Partition's resolver: the same filter spec (here an
    # `eqx.Module` of bools, a tree that is never called, and a per-leaf callable,
    # which never sees the MLP's activation functions) selects the same leaves.
    model = eqx.nn.MLP(3, 2, 4, 1, key=jr.key(0))
    is_matrix = jax.tree.map(lambda x: eqx.is_array(x) and x.ndim == 2, model)
    has_mu = lambda tree: [
        x is not None for x in jax.tree.leaves(tree, is_leaf=is_none)
    ]
    for spec in (is_matrix, lambda p: p.ndim == 2 and p.shape[0] == 4):
        state = eqxopt.Muon(0.02, matrix_mask=spec).init(model)
        part = eqxopt.Partition(
            {True: eqxopt.Adam(1.0), False: eqxopt.Adam(0.1)}, labels=spec
        ).init(model)
        assert has_mu(state.mu) == has_mu(part.inner_states[True].mu)
        assert has_mu(state.fallback_state.mu) == has_mu(part.inner_states[False].mu)
        assert any(has_mu(state.mu)) and any(has_mu(state.fallback_state.mu))


class _Counter(eqx.Module):
    count: jax.Array


def test_fallback_drift_names_the_path_inside_muon_state():
    # The fallback is called through `child_update`, so a drift in its state is
    # reported at its path in Muon's state.
    class Drifting(eqxopt.AbstractOptimizer):
        def init(self, params):
            return _Counter(jnp.zeros((), jnp.int32))

        def update(self, grads, state, params=None, **extra):
            return grads, _Counter(jnp.zeros((), jnp.float32))

    params = {"w": jnp.ones((3, 2)), "b": jnp.ones(3)}
    opts: list[eqxopt.AbstractOptimizer] = [
        eqxopt.Muon(0.02, fallback=Drifting()),
        eqxopt.NorMuon(fallback=Drifting()),
    ]
    for opt in opts:
        with pytest.raises(eqxopt.StateDriftError, match=r"\.fallback_state\.count"):
            opt.update(params, opt.init(params), params)
