"""Checkpoints: `eqx.tree_serialise_leaves` of `(opt, state)` (array hyperparameters,
Optax states, sharded states) and Orbax for sharded state; resuming is bit-identical."""

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

from .helpers import make_params, random_like


def _loss(params, x):
    h = jnp.tanh(x @ params["w1"].T + params["b1"])
    return jnp.mean((h @ params["w2"].T) ** 2)


def _data(n_steps):
    return jr.normal(jr.key(7), (n_steps, 16, 8), jnp.float32)


def _params():
    k1, k2 = jr.split(jr.key(0))
    return {
        "w1": jr.normal(k1, (16, 8), jnp.float32) / 3,
        "b1": jnp.zeros(16, jnp.float32),
        "w2": jr.normal(k2, (4, 16), jnp.float32) / 4,
    }


@eqx.filter_jit
def _train_step(opt, params, state, x):
    grads = jax.grad(_loss)(params, x)
    return opt.step(params, grads, state)


def _run(opt, params, state, xs):
    for x in xs:
        params, state = _train_step(opt, params, state, x)
    return params, state


def _is_matrix(p):
    return p.ndim == 2


def _make_opt(lr):
    # A module-level mask: equal optimizers are then equal static data, so a rebuilt
    # optimizer reuses the compiled step.
    return eqxopt.Chain(
        eqxopt.ClipByGlobalNorm(1.0),
        eqxopt.AdamW(lr, b1=0.8, weight_decay=0.05, mask=_is_matrix),
    )


def test_serialise_resume_with_changed_array_hyperparameter(tmp_path):
    xs = _data(6)
    opt = _make_opt(jnp.asarray(1e-2, jnp.float32))
    params, state = _run(opt, _params(), opt.init(_params()), xs[:3])
    # Lower the learning rate mid-training (no recompile: it is an array leaf)...
    opt = eqx.tree_at(
        lambda o: o.optimizers[1].learning_rate, opt, jnp.asarray(3e-3, jnp.float32)
    )
    path = tmp_path / "ckpt.eqx"
    eqx.tree_serialise_leaves(path, (opt, state, params))
    # ...and the checkpoint restores it into a skeleton built with another value.
    skeleton_opt = _make_opt(jnp.asarray(1.0, jnp.float32))
    skeleton = (skeleton_opt, skeleton_opt.init(_params()), _params())
    opt2, state2, params2 = eqx.tree_deserialise_leaves(path, skeleton)
    assert opt2.optimizers[1].learning_rate == jnp.asarray(3e-3, jnp.float32)
    resumed = _run(opt2, params2, state2, xs[3:])
    straight = _run(opt, params, state, xs[3:])
    assert eqx.tree_equal(resumed, straight, typematch=True)


def test_serialise_resume_from_optax_state(tmp_path):
    def make():
        return eqxopt.from_optax(
            optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
        )

    xs = _data(4)
    opt = make()
    with jax.numpy_dtype_promotion("standard"):
        params, state = _run(opt, _params(), opt.init(_params()), xs[:2])
        eqx.tree_serialise_leaves(tmp_path / "ckpt.eqx", (state, params))
        skeleton = (make().init(_params()), _params())
        state2, params2 = eqx.tree_deserialise_leaves(tmp_path / "ckpt.eqx", skeleton)
        # A fresh `from_optax(...)` around an equal transformation resumes it.
        resumed = _run(make(), params2, state2, xs[2:])
        straight = _run(opt, params, state, xs[2:])
    assert eqx.tree_equal(resumed, straight, typematch=True)


def _sharded_setup():
    """Model-parallel params over a (data=4, model=2) mesh; jitted, donated step with
    the state's shardings pinned by `eqxopt.state_shardings`."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    specs = {"w1": P("model", None), "b1": P("model"), "w2": P(None, "model")}
    shard = {k: NamedSharding(mesh, s) for k, s in specs.items()}
    opt = _make_opt(1e-2)
    params = jax.device_put(_params(), shard)
    state_sh = eqxopt.state_shardings(opt, params)
    state = jax.jit(opt.init, out_shardings=state_sh)(params)
    step = jax.jit(
        lambda p, s, x: _train_step(opt, p, s, x),
        in_shardings=(shard, state_sh, NamedSharding(mesh, P("data"))),
        out_shardings=(shard, state_sh),
        donate_argnums=(0, 1),
    )
    return mesh, opt, params, state, shard, state_sh, step


def _copy(tree):
    return jtu.tree_map(jnp.copy, tree)  # the step donates its inputs


def test_eqx_serialise_sharded_state(tmp_path):
    _, opt, params, state, shard, state_sh, step = _sharded_setup()
    xs = _data(4)
    for x in xs[:2]:
        params, state = step(params, state, x)
    eqx.tree_serialise_leaves(tmp_path / "ckpt.eqx", (params, state))

    # An abstract skeleton (nothing allocated), and a loader that places each leaf.
    def load(f, like):
        if isinstance(like, jax.ShapeDtypeStruct) and like.sharding is not None:
            return jax.device_put(np.load(f), like.sharding)
        return eqx.default_deserialise_filter_spec(f, like)

    def abstract(tree, shardings):
        return jtu.tree_map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            jax.eval_shape(lambda: tree),
            shardings,
        )

    skeleton = (abstract(params, shard), abstract(state, state_sh))
    params2, state2 = eqx.tree_deserialise_leaves(
        tmp_path / "ckpt.eqx", skeleton, filter_spec=load
    )
    for leaf, sharding in zip(jtu.tree_leaves(state2), jtu.tree_leaves(state_sh)):
        assert leaf.sharding == sharding
    resumed = _copy((params2, state2))
    straight = _copy((params, state))
    for x in xs[2:]:
        resumed = step(*resumed, x)
        straight = step(*straight, x)
    assert eqx.tree_equal(resumed, straight, typematch=True)


def test_orbax_sharded_round_trip(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    mesh, opt, params, state, shard, state_sh, step = _sharded_setup()
    xs = _data(4)
    for x in xs[:2]:
        params, state = step(params, state, x)
    path = tmp_path / "ckpt"
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(path, {"params": params, "state": state})

    # Restore into an abstract target: shapes, dtypes and shardings, nothing else.
    target = {
        "params": jtu.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
            params,
        ),
        "state": jtu.tree_map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            jax.eval_shape(opt.init, params),
            eqxopt.state_shardings(opt, params),
        ),
    }
    with ocp.StandardCheckpointer() as ckpt:
        restored = ckpt.restore(path, target)
    assert isinstance(restored["state"][1], eqxopt.AdamState)
    for leaf, sharding in zip(
        jtu.tree_leaves(restored["state"]), jtu.tree_leaves(state_sh)
    ):
        assert leaf.sharding == sharding
    w1_mu = restored["state"][1].mu["w1"]
    assert w1_mu.sharding.spec == P("model", None)
    assert not w1_mu.sharding.is_fully_replicated

    resumed = (restored["params"], restored["state"])
    straight = _copy((params, state))
    for x in xs[2:]:
        resumed = step(*resumed, x)
        straight = step(*straight, x)
    assert eqx.tree_equal(resumed, straight, typematch=True)

    # Restoring onto another layout (here: replicated on one device) reshards.
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    elsewhere = jtu.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), target
    )
    with ocp.StandardCheckpointer() as ckpt:
        moved = ckpt.restore(path, elsewhere)
    assert eqx.tree_equal(
        jax.device_get(moved),
        jax.device_get({"params": params, "state": state}),
        typematch=True,
    )


def test_mid_training_resume_for_a_plain_params_tree(tmp_path):
    """As tests/test_core_protocol.py, with a skeleton built abstractly
    (`eval_shape`)."""
    params = make_params()
    opt = eqxopt.Adam(1e-2)
    state = opt.init(params)
    grads = [random_like(k, params) for k in jr.split(jr.key(0), 4)]
    for g in grads[:2]:
        params, state = opt.step(params, g, state)
    eqx.tree_serialise_leaves(tmp_path / "ckpt.eqx", (opt, state))
    skeleton = (eqxopt.Adam(1e-2), jax.eval_shape(opt.init, params))
    opt2, state2 = eqx.tree_deserialise_leaves(tmp_path / "ckpt.eqx", skeleton)
    p1, s1, p2, s2 = params, state, params, state2
    for g in grads[2:]:
        p1, s1 = opt.step(p1, g, s1)
        p2, s2 = opt2.step(p2, g, s2)
    assert eqx.tree_equal((p1, s1), (p2, s2), typematch=True)


# --- Checkpoints across versions of the optimizer (eqxopt.save_checkpoint,
# eqxopt.load_checkpoint, eqxopt.check_checkpoint) ---------------------------------


def test_restore_state_into_optimizer_with_new_hyperparameters(tmp_path):
    xs = _data(5)
    old = eqxopt.AdamW(1e-2, weight_decay=0.01)
    params, state = _run(old, _params(), old.init(_params()), xs[:2])
    eqxopt.save_checkpoint(tmp_path / "state.eqx", state)
    # A new learning rate and more weight decay: the state has the same structure,
    # so it restores, and training with the new optimizer continues from it exactly
    # as from the state in memory.
    new = eqxopt.AdamW(3e-3, weight_decay=0.1)
    restored = eqxopt.load_checkpoint(
        tmp_path / "state.eqx", eqxopt.abstract_state(new, _params())
    )
    assert eqx.tree_equal(restored, state, typematch=True)
    resumed = _run(new, params, restored, xs[2:])
    straight = _run(new, params, state, xs[2:])
    assert eqx.tree_equal(resumed, straight, typematch=True)
    # ...and differs from continuing with the old hyperparameters.
    assert not eqx.tree_equal(resumed, _run(old, params, state, xs[2:]))


def test_restore_into_another_optimizer_class_names_the_path(tmp_path):
    params = _params()
    eqxopt.save_checkpoint(tmp_path / "adam.eqx", eqxopt.Adam(1e-2).init(params))
    # Lion's state has Adam's first leaves (count, mu) and no `nu`: without the
    # header Equinox would read the first leaves into it and never notice.
    lion = eqxopt.Lion(1e-3)
    with pytest.raises(eqxopt.CheckpointMismatchError, match="AdamState.*LionState"):
        eqxopt.load_checkpoint(tmp_path / "adam.eqx", lion.init(params))
    # Same leaves, another class: RMSProp's `nu` vs Adagrad's accumulator.
    eqxopt.save_checkpoint(tmp_path / "rms.eqx", eqxopt.RMSProp(1e-2).init(params))
    with pytest.raises(eqxopt.CheckpointMismatchError) as info:
        eqxopt.load_checkpoint(
            tmp_path / "rms.eqx", eqxopt.abstract_state(eqxopt.Adagrad(1e-2), params)
        )
    assert info.value.path == ""
    assert "RMSPropState" in str(info.value) and "AdagradState" in str(info.value)
    # Nested: the error names the path of the node that differs.
    chain = eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.Adam(1e-2))
    eqxopt.save_checkpoint(tmp_path / "chain.eqx", (chain.init(params), params))
    other = eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.Lion(1e-2))
    with pytest.raises(eqxopt.CheckpointMismatchError) as info:
        eqxopt.check_checkpoint(tmp_path / "chain.eqx", (other.init(params), params))
    assert info.value.path == "[0][1]"
    assert "`[0][1]`" in str(info.value)


def test_restore_into_another_param_tree_names_the_path(tmp_path):
    opt = eqxopt.AdamW(1e-2)
    params = _params()
    eqxopt.save_checkpoint(tmp_path / "ckpt.eqx", (params, opt.init(params)))
    # Another shape.
    wider = dict(params, w1=jnp.zeros((32, 8), jnp.float32))
    with pytest.raises(eqxopt.CheckpointMismatchError) as info:
        eqxopt.load_checkpoint(tmp_path / "ckpt.eqx", (wider, opt.init(wider)))
    assert info.value.path == "[0]['w1']"
    assert "float32(16, 8)" in str(info.value) and "float32(32, 8)" in str(info.value)
    # An extra param: the first path that differs is the new one.
    more = dict(params, a=jnp.zeros(3, jnp.float32))
    with pytest.raises(eqxopt.CheckpointMismatchError) as info:
        eqxopt.load_checkpoint(tmp_path / "ckpt.eqx", (more, opt.init(more)))
    assert info.value.path == "[0]['a']"
    # A missing param.
    fewer = {k: v for k, v in params.items() if k != "w2"}
    with pytest.raises(eqxopt.CheckpointMismatchError) as info:
        eqxopt.load_checkpoint(tmp_path / "ckpt.eqx", (fewer, opt.init(fewer)))
    assert info.value.path == "[1].count"  # where `w2` was, the target goes on
    # Another state dtype (an optimizer built with `state_dtype=`).
    bf16 = eqxopt.AdamW(1e-2, state_dtype=jnp.bfloat16)
    with pytest.raises(eqxopt.CheckpointMismatchError) as info:
        eqxopt.check_checkpoint(
            tmp_path / "ckpt.eqx", (params, eqxopt.abstract_state(bf16, params))
        )
    assert info.value.path == "[1].mu['b1']"
    assert "bfloat16" in str(info.value)


def test_load_checkpoint_checks_plain_equinox_files(tmp_path):
    params = _params()
    state = eqxopt.Adam(1e-2).init(params)
    eqx.tree_serialise_leaves(tmp_path / "plain.eqx", state)
    # A plain file restores as with Equinox...
    restored = eqxopt.load_checkpoint(
        tmp_path / "plain.eqx", jax.eval_shape(lambda: state)
    )
    assert eqx.tree_equal(restored, state, typematch=True)
    # ...and a mismatch is found from the arrays' own headers, before reading.
    wider = dict(params, w2=jnp.zeros((4, 32), jnp.float32))
    with pytest.raises(eqxopt.CheckpointMismatchError) as info:
        eqxopt.load_checkpoint(tmp_path / "plain.eqx", eqxopt.Adam(1e-2).init(wider))
    assert info.value.path == ".mu['w2']"
    with pytest.raises(eqxopt.CheckpointMismatchError, match="ends before"):
        eqxopt.load_checkpoint(tmp_path / "plain.eqx", (state, params))


def test_load_checkpoint_places_sharded_structs(tmp_path):
    _, opt, params, state, shard, state_sh, _ = _sharded_setup()
    eqxopt.save_checkpoint(tmp_path / "ckpt.eqx", (params, state))
    target = (
        jtu.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
            params,
        ),
        eqxopt.abstract_state(opt, params),
    )
    params2, state2 = eqxopt.load_checkpoint(tmp_path / "ckpt.eqx", target)
    for leaf, sharding in zip(jtu.tree_leaves(state2), jtu.tree_leaves(state_sh)):
        assert leaf.sharding == sharding
    assert eqx.tree_equal((params2, state2), (params, state), typematch=True)


def test_orbax_mismatching_target_names_the_path(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    params = _params()
    opt = eqxopt.AdamW(1e-2)
    path = tmp_path / "orbax"
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(path, {"params": params, "state": opt.init(params)})

    def target(opt, params):
        return {
            "params": jax.eval_shape(lambda: params),
            "state": eqxopt.abstract_state(opt, params),
        }

    eqxopt.check_checkpoint(path, target(opt, params))  # matches: no error
    # Another optimizer class: Lion's state lacks `nu`.
    with pytest.raises(eqxopt.CheckpointMismatchError) as info:
        eqxopt.check_checkpoint(path, target(eqxopt.Lion(1e-3), params))
    assert info.value.path == "state.nu.b1"
    # Another shape: Orbax's own error does not say which array.
    wider = dict(params, w1=jnp.zeros((32, 8), jnp.float32))
    with pytest.raises(eqxopt.CheckpointMismatchError) as info:
        eqxopt.check_checkpoint(path, target(opt, wider))
    assert info.value.path == "['params']['w1']"
    # Another dtype: Orbax would cast silently.
    bf16 = eqxopt.AdamW(1e-2, state_dtype=jnp.bfloat16)
    with pytest.raises(eqxopt.CheckpointMismatchError, match="bfloat16") as info:
        eqxopt.check_checkpoint(path, target(bf16, params))
    assert info.value.path == "['state'].mu['b1']"
