"""Sharded params on an 8-device CPU mesh: every registry entry keeps its state sharded
like its params (eagerly, under `jit` and across steps), a jitted sharded step equals
the single-device one, and `eqxopt.state_shardings` predicts the state's shardings."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import eqxopt
import eqxopt._misc

from .helpers import case_extra, case_grads, CASES, make_params, random_like, SHAPES


N = 8


def _shardable(shapes):
    """The registry's shapes (same structure and ranks: masks are keyed on them), with
    each leaf's first axis rounded up to a multiple of the mesh size unless one of its
    axes already is one."""

    def fix(shape):
        if not shape or any(n % N == 0 for n in shape):
            return shape
        return (-(-shape[0] // N) * N, *shape[1:])

    return jtu.tree_map(fix, shapes, is_leaf=lambda x: isinstance(x, tuple))


# Cheaper CPU codegen: these tests are about placement, compiled once per entry.
FAST_COMPILE = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
}


def _mesh(axis_type=AxisType.Auto):
    assert len(jax.devices()) >= N, "tests/conftest.py sets 8 host devices"
    return jax.make_mesh((N,), ("x",), axis_types=(axis_type,))


def _spec(shape) -> P:
    """Shard the first axis divisible by the mesh size; replicate scalars etc."""
    for i, n in enumerate(shape):
        if n % N == 0:
            return P(*([None] * i), "x")
    return P()


def _shard(tree, mesh):
    return jtu.tree_map(
        lambda x: jax.device_put(x, NamedSharding(mesh, _spec(x.shape))), tree
    )


def _param_shaped(state, params):
    """`(path, state leaf, param)` for every state leaf mirroring a param: its path
    ends with the param's path and it has the param's shape (longest path wins).
    Scalars are left out (per-leaf scalars such as norms or NaN flags are no buffers
    worth sharding)."""
    flat_params = [(jtu.keystr(p), x) for p, x in jtu.tree_flatten_with_path(params)[0]]
    out = []
    for path, leaf in jtu.tree_flatten_with_path(state)[0]:
        if leaf.ndim == 0:
            continue
        where = jtu.keystr(path)
        match = [
            (p_path, x)
            for p_path, x in flat_params
            if where.endswith(p_path) and x.shape == leaf.shape
        ]
        if match:
            out.append((where, leaf, max(match, key=lambda m: len(m[0]))[1]))
    return out


def _assert_sharded_like_params(state, params, what):
    pairs = _param_shaped(state, params)
    for where, leaf, param in pairs:
        assert leaf.sharding.is_equivalent_to(param.sharding, param.ndim), (
            f"{what}: state{where} is {leaf.sharding}, its param {param.sharding}"
        )
    return pairs


def _params_for(case):
    return make_params(
        jnp.float32, _shardable(SHAPES if case.shapes is None else case.shapes)
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_registry_entry_on_mesh(case):
    mesh = _mesh()
    opt = case.make()
    params = _params_for(case)
    grads = case_grads(case, params, jr.key(1))
    sharded_params, sharded_grads = _shard(params, mesh), _shard(grads, mesh)
    assert not all(
        x.sharding.is_fully_replicated for x in jtu.tree_leaves(sharded_params)
    )
    replicated = NamedSharding(mesh, P())
    rep_params, rep_grads = jax.device_put((params, grads), replicated)

    # `init`, eagerly and under `jit`, shards buffers like their params, as
    # `state_shardings` predicts.
    predicted = eqxopt.state_shardings(opt, sharded_params)
    for what, state in [
        ("eager init", opt.init(sharded_params)),
        ("jit(init)", eqx.filter_jit(opt.init)(sharded_params)),
    ]:
        mirrored = _assert_sharded_like_params(state, sharded_params, what)
        predicted_at = dict(
            (jtu.keystr(path), s) for path, s in jtu.tree_leaves_with_path(predicted)
        )
        for where, leaf, _ in mirrored:
            assert leaf.sharding.is_equivalent_to(predicted_at[where], leaf.ndim), (
                f"{what}: state{where} is {leaf.sharding}, state_shardings predicted "
                f"{predicted_at[where]}"
            )

    # One jitted step on sharded params equals the same step on replicated ones (the
    # single-device computation), compiled together; the state stays sharded.
    def steps(sp, sg, rp, rg):
        out = opt.update(sg, opt.init(sp), sp, **case_extra(case, sp))
        ref = opt.update(rg, opt.init(rp), rp, **case_extra(case, rp))
        return out, eqx.filter_shard(ref, replicated)

    (updates, new_state), ref = jax.jit(steps, compiler_options=FAST_COMPILE)(
        sharded_params, sharded_grads, rep_params, rep_grads
    )
    _assert_sharded_like_params(new_state, sharded_params, "after one jitted step")
    # Sharded reductions (norms, Newton-Schulz matmuls) add in another order.
    assert eqx.tree_equal(
        jax.device_get((updates, new_state)),
        jax.device_get(ref),
        typematch=True,
        rtol=1e-5,
        atol=1e-6,
    ), "the sharded step differs from the replicated one"


@pytest.mark.parametrize(
    "make",
    [
        lambda: eqxopt.Adam(1e-2),
        lambda: eqxopt.Muon(1e-2),
        # Blocks of 5 cut the sharded axes (of 8) into pieces the mesh does not divide
        # (SOAP, and Shampoo unblocked: tests/test_matrix_sharding.py).
        lambda: eqxopt.Shampoo(
            1e-2,
            5,
            start_preconditioning_step=0,
            best_effort_shape_interpretation=False,
        ),
    ],
    ids=["adam", "muon", "shampoo_blocks"],
)
def test_explicit_mesh(make):
    """With sharding in types (`jax.make_mesh`'s default axis type), state types carry
    the params' shardings, and a step under `jax.set_mesh` keeps them."""
    mesh = _mesh(AxisType.Explicit)
    opt = make()
    params = make_params(jnp.float32, _shardable(SHAPES))
    grads = random_like(jr.key(1), params)
    ref = jax.jit(opt.update)(grads, opt.init(params), params)
    with jax.set_mesh(mesh):
        params, grads = _shard(params, mesh), _shard(grads, mesh)
        state = jax.jit(opt.init)(params)
        _assert_sharded_like_params(state, params, "jit(init)")
        updates, state = jax.jit(opt.update)(grads, state, params)
        _assert_sharded_like_params(state, params, "after one step")
    assert eqx.tree_equal(
        jax.device_get((updates, state)), jax.device_get(ref), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8"])
def test_quantized_state_on_explicit_mesh(fmt):
    """Quantized state steps under `jax.set_mesh` with `Explicit` axes: its codes and
    scales are placed as `eqxopt.state_shardings` predicts, and the step's numbers
    are those without a mesh."""
    mesh = _mesh(AxisType.Explicit)
    spec = eqxopt.Quantized(fmt, block_size=4, min_size=1)
    opt = eqxopt.AdamW(1e-2, state_dtype=spec)
    params = make_params(jnp.float32, _shardable(SHAPES))
    grads = random_like(jr.key(1), params)
    ref = jax.jit(opt.step)(params, grads, opt.init(params))
    with jax.set_mesh(mesh):
        params, grads = _shard(params, mesh), _shard(grads, mesh)
        out = jax.jit(opt.step)(params, grads, jax.jit(opt.init)(params))
    predicted = eqxopt.state_shardings(opt, params)
    quantized = 0
    for (path, leaf), want in zip(
        jtu.tree_flatten_with_path(out[1])[0], jtu.tree_leaves(predicted)
    ):
        assert leaf.sharding.is_equivalent_to(want, leaf.ndim), jtu.keystr(path)
        quantized += "codes" in jtu.keystr(path) and len(want.spec) > 0
    assert quantized, "no quantized buffer was split over the mesh"
    assert eqx.tree_equal(jax.device_get(out), jax.device_get(ref))


def test_state_shardings_from_abstract_params():
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    # An abstract model (nothing allocated), with activation functions as leaves.
    abstract = eqx.filter_eval_shape(eqx.nn.MLP, 8, 4, 16, 2, key=jr.key(0))

    def sharding(x):
        if not isinstance(x, jax.ShapeDtypeStruct):
            return None
        return NamedSharding(mesh, P("model", None) if x.ndim == 2 else P())

    shardings = jtu.tree_map(sharding, abstract)
    opt = eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.AdamW(1e-3))
    from_abstract = eqxopt.state_shardings(opt, abstract, shardings)
    adamw = from_abstract[1]
    assert adamw.mu.layers[0].weight == NamedSharding(mesh, P("model", None))
    assert adamw.nu.layers[1].bias == NamedSharding(mesh, P())
    assert adamw.count == NamedSharding(mesh, P())

    # The same from concrete sharded params.
    model = eqx.filter_shard(eqx.nn.MLP(8, 4, 16, 2, key=jr.key(0)), shardings)
    assert eqx.tree_equal(eqxopt.state_shardings(opt, model), from_abstract)

    # `abstract_state`: the target a checkpoint is restored into.
    target = eqxopt.abstract_state(opt, abstract, shardings)
    state = opt.init(model)
    assert jtu.tree_structure(target) == jtu.tree_structure(state)
    for t, x in zip(jtu.tree_leaves(target), jtu.tree_leaves(state)):
        assert (t.shape, t.dtype) == (x.shape, x.dtype)
        assert x.sharding.is_equivalent_to(t.sharding, x.ndim) or x.ndim == 0
    unsharded = eqxopt.abstract_state(opt, abstract)
    assert jtu.tree_leaves(unsharded)[1].sharding is None


class _Gram(eqxopt.AbstractOptimizer):
    """An `init` the sharding-in-types rules cannot type (a matmul contracting a
    sharded axis): `state_shardings` falls back to matching paths and shapes."""

    def init(self, params):
        return {
            "mirror": eqxopt._misc.zeros_like(params),
            "gram": jtu.tree_map(lambda p: p.T @ p, params),
        }

    def update(self, grads, state, params=None, **extra):
        return grads, state


def test_state_shardings_fallback():
    mesh = _mesh()
    params = {"w": jax.device_put(jnp.ones((N, 2)), NamedSharding(mesh, P("x")))}
    shardings = eqxopt.state_shardings(_Gram(), params)
    assert shardings["mirror"]["w"] == params["w"].sharding
    assert shardings["gram"]["w"] == NamedSharding(mesh, P())


def test_state_shardings_single_device_and_errors():
    device = jax.devices()[1]
    params = {"w": jax.device_put(jnp.ones(3), device)}
    shardings = eqxopt.state_shardings(eqxopt.Adam(1e-3), params)
    assert shardings.mu["w"] == shardings.count == params["w"].sharding

    with pytest.raises(ValueError, match="cannot tell the params' shardings"):
        eqxopt.state_shardings(
            eqxopt.Adam(1e-3), {"w": jax.ShapeDtypeStruct((3,), jnp.float32)}
        )
    mesh_a = jax.make_mesh((4,), ("x",), devices=jax.devices()[:4])
    mesh_b = jax.make_mesh((4,), ("x",), devices=jax.devices()[4:])
    two_meshes = {
        "a": jax.device_put(jnp.ones(4), NamedSharding(mesh_a, P("x"))),
        "b": jax.device_put(jnp.ones(4), NamedSharding(mesh_b, P("x"))),
    }
    with pytest.raises(ValueError, match="different meshes"):
        eqxopt.state_shardings(eqxopt.Adam(1e-3), two_meshes)


def test_inside_shard_map():
    """Data and model parallel inside `shard_map`: params and state sharded over
    "model" (`in_specs` from `state_shardings`), the batch over "data"; an elementwise
    optimizer's per-shard step equals the unsharded step."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    opt = eqxopt.AdamW(1e-2, weight_decay=0.1)
    params = {
        "w": jr.normal(jr.key(1), (3, 4), jnp.float32),
        "b": jnp.ones(4, jnp.float32),
    }
    x = jr.normal(jr.key(0), (16, 3), jnp.float32)

    def loss(p, x):
        return jnp.mean((x @ p["w"] + p["b"]) ** 2)

    def global_loss(p, x):  # on one device's block: psum makes it the global mean
        local = jnp.sum((x @ p["w"] + p["b"]) ** 2)
        return jax.lax.psum(local, ("data", "model")) / (16 * 4)

    def local_step(p, s, x):
        # `p` is invariant over "data", so its gradient is summed over "data".
        return opt.step(p, jax.grad(global_loss)(p, x), s)

    param_specs = {"w": P(None, "model"), "b": P("model")}
    sharded = jax.device_put(
        params, {k: NamedSharding(mesh, v) for k, v in param_specs.items()}
    )
    state_shardings = eqxopt.state_shardings(opt, sharded)
    state_specs = jtu.tree_map(lambda s: s.spec, state_shardings)
    step = jax.jit(
        jax.shard_map(
            local_step,
            mesh=mesh,
            in_specs=(param_specs, state_specs, P("data")),
            out_specs=(param_specs, state_specs),
        )
    )
    state = opt.init(params)
    got = step(sharded, jax.jit(opt.init, out_shardings=state_shardings)(sharded), x)
    want = opt.step(params, jax.grad(loss)(params, x), state)
    assert got[1].mu["w"].sharding.spec == P(None, "model")
    assert eqx.tree_equal(jax.device_get(got), want, rtol=1e-5, atol=1e-6)


def test_zeros_keep_sharding_under_jit():
    """`eqxopt._misc.zeros_like` (used by every `init`) follows the param's sharding
    under `jit` with an Auto mesh, where `jnp.zeros(shape)` would be replicated."""
    mesh = _mesh()
    p = jax.device_put(jnp.ones((N, 2), jnp.bfloat16), NamedSharding(mesh, P("x")))
    z = jax.jit(lambda p: eqxopt._misc.zeros_like(p, jnp.float32))(p)
    assert z.dtype == np.dtype(jnp.float32)
    assert z.sharding.is_equivalent_to(p.sharding, 2)
    assert not jnp.any(z)
