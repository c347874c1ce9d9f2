"""ZeRO stage 1 on an 8-device CPU mesh: params (and gradients) replicated over a
data-parallel axis, the optimizer state split over it by
`eqxopt.state_shardings(..., shard_over=...)`. Each device holds 1/8 of the state,
and training gives the numbers of replicated state; the split state checkpoints
with Orbax and restores onto the same or another mesh."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import eqxopt

from .helpers import case_extra, case_grads, CASES, make_params, SHAPES
from .test_sharding import _shardable, FAST_COMPILE, N


AXIS_TYPES = pytest.mark.parametrize(
    "axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"]
)


def _mesh(axis_type, devices=N):
    return jax.make_mesh(
        (devices,), ("data",), axis_types=(axis_type,), devices=jax.devices()[:devices]
    )


def _params():
    """A small MLP's params: every leaf has a dimension divisible by 8."""
    k1, k2 = jr.split(jr.key(0))
    return {
        "w1": jr.normal(k1, (32, 8), jnp.float32) / 3,
        "b1": jnp.zeros(32, jnp.float32),
        "w2": jr.normal(k2, (8, 32), jnp.float32) / 6,
        "b2": jnp.zeros(8, jnp.float32),
    }


def _loss(params, x, y):
    h = jnp.tanh(x @ params["w1"].T + params["b1"])
    return jnp.mean((h @ params["w2"].T + params["b2"] - y) ** 2)


def _batches(steps):
    xs, ys = (jr.normal(k, (steps, 64, 8), jnp.float32) for k in jr.split(jr.key(1)))
    return list(zip(xs, ys))


def _step(opt, param_sh, state_sh):
    """A jitted data-parallel training step whose `out_shardings` are the params'
    and the state's shardings."""

    def step(params, state, x, y):
        grads = jax.grad(_loss)(params, x, y)
        return opt.step(params, grads, state)

    return jax.jit(step, out_shardings=(param_sh, state_sh))


def _setup(opt, mesh, shard_over):
    """Replicated params, the state initialised onto `state_shardings(...,
    shard_over=...)`, and the training step."""
    with jax.set_mesh(mesh):
        params = jax.device_put(_params(), NamedSharding(mesh, P()))
        param_sh = jtu.tree_map(lambda x: x.sharding, params)
        state_sh = eqxopt.state_shardings(opt, params, shard_over=shard_over)
        state = jax.jit(opt.init, out_shardings=state_sh)(params)
    return params, state, state_sh, _step(opt, param_sh, state_sh)


def _train(mesh, step, params, state, batches):
    split = NamedSharding(mesh, P("data"))
    with jax.set_mesh(mesh):
        for x, y in batches:
            x, y = jax.device_put((x, y), split)
            params, state = step(params, state, x, y)
    return params, state


def _bytes_per_device(tree) -> dict:
    """The bytes each device holds of the arrays of `tree` (from their shards)."""
    out = {}
    for leaf in jtu.tree_leaves(tree):
        for shard in leaf.addressable_shards:
            out[shard.device] = out.get(shard.device, 0) + shard.data.nbytes
    return out


def _spec(sharding) -> tuple:
    """A sharding's spec as a tuple, without trailing `None`s. (`None`: an abstract
    value built from constants, on no mesh: replicated.)"""
    spec = [] if sharding is None else list(sharding.spec)
    while spec and spec[-1] is None:
        spec.pop()
    return tuple(spec)


def _assert_same_numbers(got, want, axis_type):
    got, want = jax.device_get(got), jax.device_get(want)
    if axis_type == AxisType.Auto:
        assert eqx.tree_equal(got, want, typematch=True)
    else:
        # On `Explicit` axes the split program is fused differently (the update is
        # computed on each device's slice, then gathered into the params), and XLA's
        # CPU code generation may contract another set of multiply-adds into fused
        # ones: equal up to float32 rounding (bit for bit with the suite's XLA flags).
        assert eqx.tree_equal(got, want, typematch=True, rtol=1e-6, atol=1e-9)


def _run(opt, mesh, shard_over, batches):
    """`(params, state, state shardings)` after training on `batches`."""
    params, state, state_sh, step = _setup(opt, mesh, shard_over)
    params, state = _train(mesh, step, params, state, batches)
    return params, state, state_sh


@AXIS_TYPES
def test_adamw_state_is_an_eighth_per_device_and_trains_the_same(axis_type):
    mesh = _mesh(axis_type)
    opt = eqxopt.AdamW(1e-2, weight_decay=0.1)
    batches = _batches(4)
    *replicated, _ = _run(opt, mesh, None, batches)
    *split, state_sh = _run(opt, mesh, "data", batches)
    # Every moment is split over "data" along its first dimension; the step count
    # is replicated.
    for sharding in jtu.tree_leaves((state_sh.mu, state_sh.nu)):
        assert _spec(sharding) == ("data",)
    assert _spec(state_sh.count) == ()
    for leaf, sharding in zip(jtu.tree_leaves(split[1]), jtu.tree_leaves(state_sh)):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)

    # Per device: 1/8 of the moments, and the 4-byte step count.
    moments = 2 * sum(x.nbytes for x in jtu.tree_leaves(_params()))
    assert set(_bytes_per_device(replicated[1]).values()) == {moments + 4}
    assert set(_bytes_per_device(split[1]).values()) == {moments // N + 4}
    # The params stay replicated, and training gives the same numbers.
    assert all(p.sharding.is_fully_replicated for p in jtu.tree_leaves(split[0]))
    _assert_same_numbers(split, replicated, axis_type)


@AXIS_TYPES
def test_multisteps_accumulator_and_inner_state_are_split(axis_type):
    mesh = _mesh(axis_type)
    opt = eqxopt.MultiSteps(eqxopt.AdamW(1e-2), every_k=2)
    batches = _batches(4)  # two inner steps
    *replicated, _ = _run(opt, mesh, None, batches)
    *split, state_sh = _run(opt, mesh, "data", batches)
    buffers = (state_sh.acc_grads, state_sh.inner_state.mu, state_sh.inner_state.nu)
    for sharding in jtu.tree_leaves(buffers):
        assert _spec(sharding) == ("data",)
    # Per device: 1/8 of the three buffers, and the scalars (counters, a flag).
    three = 3 * sum(x.nbytes for x in jtu.tree_leaves(_params()))
    scalars = sum(x.nbytes for x in jtu.tree_leaves(split[1]) if x.ndim == 0)
    assert set(_bytes_per_device(split[1]).values()) == {three // N + scalars}
    _assert_same_numbers(split, replicated, axis_type)


@AXIS_TYPES
def test_which_dimension_each_buffer_is_split_along(axis_type):
    """The first dimension that the param's sharding leaves unsharded and that the
    axes divide; a tuple of axes splits one dimension over their product, without
    the axes the param is sharded over already. A buffer none of whose dimensions
    qualifies keeps the param's sharding; leaves that mirror no param (the step
    count) are not split."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)

    def param(shape, *spec):
        sharding = NamedSharding(mesh, P(*spec))
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)

    params = {
        "w": param((8, 6), None, "model"),
        "v": param((6, 8), None, "model"),
        "u": param((3, 16)),
        "big": param((16, 3)),
        "odd": param((3, 5)),
        "fsdp": param((8, 4), "data"),
        "scale": param(()),
    }
    opt = eqxopt.Adam(1e-3)
    expected = {
        "data": {
            "w": ("data", "model"),
            "v": (None, "model"),  # 6 is not a multiple of 4; dim 1 is sharded
            "u": (None, "data"),
            "big": ("data",),
            "odd": (),
            "fsdp": ("data",),  # already split over "data"
            "scale": (),
        },
        ("data", "model"): {
            "w": ("data", "model"),  # "model" is taken: split over "data" alone
            "v": (None, "model"),
            "u": (None, ("data", "model")),  # 16 over 4 x 2 devices
            "big": (("data", "model"),),
            "odd": (),
            "fsdp": ("data", "model"),  # "data" is taken: split over "model"
            "scale": (),
        },
    }
    for shard_over, specs in expected.items():
        shardings = eqxopt.state_shardings(opt, params, shard_over=shard_over)
        target = eqxopt.abstract_state(opt, params, shard_over=shard_over)
        assert _spec(shardings.count) == ()
        for name, spec in specs.items():
            for buffer in (shardings.mu, shardings.nu):
                assert _spec(buffer[name]) == spec, (shard_over, name)
                assert buffer[name].mesh == mesh
            assert target.mu[name].sharding == shardings.mu[name]
            if spec == _spec(params[name].sharding):
                # Nothing to add: the param's own sharding.
                assert shardings.mu[name] == params[name].sharding


def test_shard_over_an_axis_the_mesh_lacks_raises():
    mesh = _mesh(AxisType.Explicit)
    sharding = NamedSharding(mesh, P())
    params = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=sharding)}
    opt = eqxopt.Adam(1e-3)
    for bad in ("batch", ("data", "batch")):
        with pytest.raises(ValueError, match="no axis 'batch'"):
            eqxopt.state_shardings(opt, params, shard_over=bad)
        with pytest.raises(ValueError, match="no axis 'batch'"):
            eqxopt.abstract_state(opt, params, shard_over=bad)
    for bad in ((), ("data", "data"), 0):
        with pytest.raises(ValueError, match="shard_over"):
            eqxopt.state_shardings(opt, params, shard_over=bad)  # pyright: ignore
    # Params on one device have no mesh axis to split the state over.
    one = {"w": jax.device_put(jnp.ones((8, 4)), jax.devices()[0])}
    with pytest.raises(ValueError, match="shard_over.*not sharded over a mesh"):
        eqxopt.state_shardings(opt, one, shard_over="data")


@pytest.mark.parametrize(
    "name, axis_type",
    [("SOAP", AxisType.Explicit), ("Shampoo", AxisType.Auto)],
    ids=["soap-explicit", "shampoo-auto"],
)
def test_matrix_optimizers_split_their_moments_not_their_factors(name, axis_type):
    """SOAP's moments and Shampoo's momenta mirror the params and are split; the
    factor matrices, eigenbases and inverse roots (whose per-matrix work is stacked
    and spread over the mesh) stay replicated. Three steps (SOAP refreshes its bases
    and rotates its split momentum, Shampoo preconditions) give the replicated
    state's numbers."""
    from .test_matrix_sharding import _tree, OPTIMIZERS

    opt = OPTIMIZERS[name]()
    mesh = _mesh(axis_type)
    params = _tree(jr.key(2), leaves=2)
    grads = [_tree(k, leaves=2) for k in jr.split(jr.key(3), 3)]

    def run(shard_over):
        with jax.set_mesh(mesh):
            replicated = NamedSharding(mesh, P())
            p, gs = jax.device_put((params, grads), replicated)
            state_sh = eqxopt.state_shardings(opt, p, shard_over=shard_over)
            state = jax.jit(opt.init, out_shardings=state_sh)(p)
            update = jax.jit(
                opt.update,
                out_shardings=(jtu.tree_map(lambda x: x.sharding, p), state_sh),
                compiler_options=FAST_COMPILE,
            )
            updates = None
            for g in gs:
                updates, state = update(g, state, p)
        return updates, state, state_sh

    *replicated, _ = run(None)
    *split, state_sh = run("data")
    buffers = ("mu", "nu") if name == "SOAP" else ("momentum", "diagonal_momentum")
    factors = (
        ("preconditioners", "bases")
        if name == "SOAP"
        else ("statistics", "preconditioners")
    )
    for field in buffers:
        for sharding in jtu.tree_leaves(getattr(state_sh, field)):
            assert _spec(sharding) == ("data",), field
    for field in factors:
        for sharding in jtu.tree_leaves(getattr(state_sh, field)):
            assert _spec(sharding) == (), field
    for leaf, sharding in zip(jtu.tree_leaves(split[1]), jtu.tree_leaves(state_sh)):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
    for (path, a), b in zip(
        jtu.tree_leaves_with_path(jax.device_get(replicated)),
        jtu.tree_leaves(jax.device_get(split)),
    ):
        # float64, to 1e-9 of each leaf's largest entry: the split momentum's
        # rotations (SOAP) and the statistics' contractions add in another order
        # (see tests/test_matrix_sharding.py).
        a, b = np.asarray(a), np.asarray(b)
        scale = max(1.0, float(np.max(np.abs(a)))) if a.size else 1.0
        np.testing.assert_allclose(
            b, a, rtol=0, atol=1e-9 * scale, err_msg=jtu.keystr(path)
        )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_registry_entry_with_split_state_on_explicit_axes(case):
    """With sharding in types, every entry's step traces with its state split over
    the mesh (the gradients, sharded like the params, meet buffers split further:
    selects and `lax.cond` branches need operands of one type), and returns the
    state with the types `state_shardings` predicts, as a `lax.scan` carry needs.
    (Traced only: on `Auto` axes XLA places every op itself.)"""
    mesh = jax.make_mesh((N,), ("x",), axis_types=(AxisType.Explicit,))
    opt = case.make()
    shapes = _shardable(SHAPES if case.shapes is None else case.shapes)
    params = make_params(jnp.float32, shapes)
    grads = case_grads(case, params, jr.key(1))

    def abstract(tree, shardings):
        return jtu.tree_map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            jax.eval_shape(lambda: tree),
            shardings,
        )

    with jax.set_mesh(mesh):
        params, grads = jax.device_put((params, grads), NamedSharding(mesh, P()))
        state_sh = eqxopt.state_shardings(opt, params, shard_over="x")
        state = abstract(jax.eval_shape(opt.init, params), state_sh)
        extra = case_extra(case, params)
        _, new_state = jax.eval_shape(
            lambda p, g, s: opt.step(p, g, s, **extra),
            abstract(params, jtu.tree_map(lambda x: x.sharding, params)),
            abstract(grads, jtu.tree_map(lambda x: x.sharding, grads)),
            state,
        )
    for (path, leaf), sharding in zip(
        jtu.tree_leaves_with_path(new_state), jtu.tree_leaves(state_sh)
    ):
        assert _spec(leaf.sharding) == _spec(sharding), (
            f"state{jtu.keystr(path)}: {leaf.sharding.spec} after a step, "
            f"predicted {sharding.spec}"
        )


def test_orbax_restores_split_state_on_the_same_and_another_mesh(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    opt = eqxopt.AdamW(1e-2, weight_decay=0.1)
    batches = _batches(4)
    mesh = _mesh(AxisType.Explicit)
    params, state, state_sh, step = _setup(opt, mesh, "data")
    params, state = _train(mesh, step, params, state, batches[:2])
    saved = jax.device_get((params, state))
    path = tmp_path / "ckpt"
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(path, {"params": params, "state": state})

    def target(mesh):
        """On `mesh`: the params replicated, the state split over "data"."""
        replicated = NamedSharding(mesh, P())
        abstract = jtu.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
            params,
        )
        state = eqxopt.abstract_state(opt, abstract, shard_over="data")
        return {"params": abstract, "state": state}

    # (a) Onto the same mesh: each device reads back its own slice of the state,
    # and training continues bit for bit.
    eqxopt.check_checkpoint(path, target(mesh))
    with ocp.StandardCheckpointer() as ckpt:
        restored = ckpt.restore(path, target(mesh))
    for leaf, sharding in zip(
        jtu.tree_leaves(restored["state"]), jtu.tree_leaves(state_sh)
    ):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
    got = (restored["params"], restored["state"])
    assert eqx.tree_equal(jax.device_get(got), saved, typematch=True)
    resumed = _train(mesh, step, *got, batches[2:])
    straight = _train(mesh, step, params, state, batches[2:])
    assert eqx.tree_equal(jax.device_get(resumed), jax.device_get(straight))

    # (b) Onto another mesh, of 4 devices: the state split in 4.
    other = _mesh(AxisType.Explicit, devices=4)
    with ocp.StandardCheckpointer() as ckpt:
        moved = ckpt.restore(path, target(other))
    got = (moved["params"], moved["state"])
    assert eqx.tree_equal(jax.device_get(got), saved, typematch=True)
    moments = 2 * sum(x.nbytes for x in jtu.tree_leaves(_params()))
    assert set(_bytes_per_device(moved["state"]).values()) == {moments // 4 + 4}
    # Training continues there exactly as from the saved values held in memory.
    shardings = jtu.tree_map(lambda x: x.sharding, target(other))
    step = _step(opt, shardings["params"], shardings["state"])
    params, state = jax.device_put(saved, (shardings["params"], shardings["state"]))
    assert eqx.tree_equal(
        jax.device_get(_train(other, step, *got, batches[2:])),
        jax.device_get(_train(other, step, params, state, batches[2:])),
    )
