"""One process of tests/test_multiprocess.py (not a test module: pytest collects only
`test_*.py`).

    python tests/_multiprocess_worker.py train --process-id I --num-processes N
        --port PORT --checkpoint DIR --out FILE.npz
    python tests/_multiprocess_worker.py reference --checkpoint DIR --out FILE.npz

`train` (every process of an N-process job, N > 1, 4 CPU devices each): FSDP-style
training of a small Equinox MLP on one global mesh of all devices, with each
optimizer of `OPTIMIZERS` (ZeRO-style for those of `ZERO`: the model replicated,
the optimizer state split over the mesh). After `STEPS_BEFORE` steps, all processes
write one Orbax checkpoint of `(model, state)`; then training goes on for
`STEPS_AFTER` steps ("straight"); then the checkpoint is restored by the same
processes into fresh arrays and trained the same `STEPS_AFTER` steps ("resumed").

`reference` (one process, 8 CPU devices): the same training on an 8-device mesh in one
process ("straight"); then the checkpoint written by the N processes is restored onto
another mesh (4 devices) and trained `STEPS_AFTER` steps ("resumed_other_mesh").

Process 0 writes every result, gathered to the host, to `--out` as flat `.npz` arrays
named `"{optimizer}/{stage}{path}"` (e.g. `"AdamW/straight.state.mu.layers[0].weight"`).
The environment (`XLA_FLAGS`, device count) is set by the parent.
"""

import argparse
import faulthandler
import sys


STEPS_BEFORE = 3
STEPS_AFTER = 3
GLOBAL_BATCH = 32
AXIS = "fsdp"
# Trained data-parallel, ZeRO stage 1: the model replicated over the mesh, the state
# split over it by `eqxopt.state_shardings(..., shard_over=AXIS)`.
ZERO = ("ZeRO",)


def _optimizers():
    import eqxopt  # imported after the parent's environment is in place

    return {
        "AdamW": eqxopt.AdamW(learning_rate=1e-2, weight_decay=0.1),
        "ZeRO": eqxopt.AdamW(learning_rate=1e-2, weight_decay=0.1),
        "Muon": eqxopt.Muon(1e-2, weight_decay=0.01),
        "MultiSteps": eqxopt.MultiSteps(
            eqxopt.Chain(eqxopt.ZeroNans(), eqxopt.AdamW(learning_rate=1e-2)), every_k=2
        ),
        # Matrix preconditioners, set to refresh their preconditioners within the
        # 6 steps trained here.
        # SOAP factors only the axes of at most 16 (the first layer's 16 inputs, the
        # last layer's 8 outputs): their statistics have full rank after one batch
        # of 32, so their eigenbases are unique up to signs (which SOAP's update does
        # not see). A 32-long axis's statistic has rank <= 16 after one step (the
        # first layer's gradient has rank <= its 16 inputs): within its null space
        # any basis is valid, and float32 rounding differences between topologies
        # pick different ones, whose trajectories part (10% after 6 steps).
        "SOAP": eqxopt.SOAP(1e-2, precondition_frequency=2, max_precond_dim=16),
        # Shampoo in blocks of 16, unmerged. By default it merges small axes: a
        # (32, 32) weight becomes a vector of 1024 with one 1024x1024 statistic,
        # whose inverse root (a coupled Newton iteration of up to 100 steps of
        # 1024^3 matmuls) took 4 s per refresh on one device, computed again by each
        # of the 8 devices (the statistics are replicated): 340 s of training for
        # Shampoo alone on 2 shared cores. Blocks of 16 keep every factor at most
        # 16x16 (0.01 s per refresh) and put the block partition on sharded params.
        "Shampoo": eqxopt.Shampoo(
            1e-2,
            block_size=16,
            start_preconditioning_step=2,
            preconditioning_compute_steps=2,
            best_effort_shape_interpretation=False,
            # The inverse roots spread over both processes' devices (the default,
            # explicit here: it once hung; see "Why those runs hung" in
            # docs/scaling.md and benchmarks/stress_multiprocess.py).
            spread=True,
        ),
        "Kron": eqxopt.Kron(1e-2, preconditioner_update_probability=1.0),
        "NorMuon": eqxopt.NorMuon(1e-2),
    }


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["train", "reference"])
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--saved", help="reference: the train processes' --out")
    parser.add_argument("--dump-after", type=float, default=0.0)
    parser.add_argument("--optimizers", default=",".join(_optimizers()))
    args = parser.parse_args(argv)
    if args.dump_after > 0:
        # A hung process prints where it is (to stderr, which the test reports), and
        # exits.
        faulthandler.dump_traceback_later(args.dump_after, exit=True)

    import jax

    # Gloo is JAX's default CPU collectives implementation; set it explicitly, as a
    # CPU multi-process job needs it (without it, cross-process collectives fail).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if args.mode == "train":
        jax.distributed.initialize(
            coordinator_address=f"localhost:{args.port}",
            num_processes=args.num_processes,
            process_id=args.process_id,
            initialization_timeout=60,
            heartbeat_timeout_seconds=10,
            shutdown_timeout_seconds=10,
        )
    _run(args)
    if args.mode == "train":
        jax.distributed.shutdown()


def _run(args):
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import jax.random as jr
    import jax.tree_util as jtu
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import eqxopt

    n_devices = jax.device_count()
    assert n_devices == 8, n_devices
    assert jax.process_count() == args.num_processes, jax.process_count()
    assert jax.local_device_count() == 8 // args.num_processes
    mesh = jax.make_mesh((n_devices,), (AXIS,), axis_types=(AxisType.Auto,))

    def shardings(model, mesh, shard_over=None):
        """FSDP: every array's first axis split over the mesh when it divides. With
        the state split over the mesh (ZeRO), the model is replicated."""
        size = mesh.shape[AXIS]

        def one(x):
            if eqx.is_inexact_array(x):
                split = shard_over is None and x.shape and x.shape[0] % size == 0
                spec = P(AXIS) if split else P()
                return NamedSharding(mesh, spec)
            return None

        return jtu.tree_map(one, model)

    def to_global(tree, tree_shardings):
        """Host values (equal on every process) -> global arrays; each process
        supplies the shards of its own devices."""

        def one(x, s):
            if s is None:
                return x
            host = np.asarray(x)
            return jax.make_array_from_callback(host.shape, s, lambda i: host[i])

        return jtu.tree_map(one, tree, tree_shardings, is_leaf=lambda x: x is None)

    def data(step, mesh):
        kx, ky = jr.split(jr.fold_in(jr.key(1), step))
        x = np.asarray(jr.normal(kx, (GLOBAL_BATCH, 16), jnp.float32))
        y = np.asarray(jr.normal(ky, (GLOBAL_BATCH, 8), jnp.float32))
        batch = NamedSharding(mesh, P(AXIS))
        return to_global((x, y), (batch, batch))

    def make_model():
        # One hidden layer: a (32, 16) and an (8, 32) weight and their biases, every
        # leaf split over the 8 devices. (A second hidden layer, a (32, 32) weight,
        # cost about a quarter of the test's time (51 against 39 s alone), mostly the
        # matrix preconditioners' compilation, and tested nothing across processes
        # that these leaves do not.)
        return eqx.nn.MLP(16, 8, 32, 1, activation=jax.nn.tanh, key=jr.key(0))

    def loss_fn(model, x, y):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    def make_step(opt, model_sh, state_sh):
        @eqx.filter_jit(donate="all-except-first")
        def step(batch, model, state):
            model = eqx.filter_shard(model, model_sh)
            grads = eqx.filter_grad(loss_fn)(model, *batch)
            model, state = opt.step(model, grads, state)
            return eqx.filter_shard(model, model_sh), eqx.filter_shard(state, state_sh)

        return step

    def train(step, model, state, mesh, steps):
        for i in steps:
            print(f"step {i}", file=sys.stderr, flush=True)
            model, state = step(data(i, mesh), model, state)
        return model, state

    def gather(tree):
        arrays = eqx.filter(tree, eqx.is_array)
        return multihost_utils.process_allgather(arrays, tiled=True)

    results = {}

    def record(name, stage, tree):
        for path, leaf in jtu.tree_flatten_with_path(gather(tree))[0]:
            results[f"{name}/{stage}{jtu.keystr(path)}"] = np.asarray(leaf)

    def target(opt, host_model, mesh, shard_over):
        """The abstract `(model, state)` on `mesh`: the model's shapes and dtypes with
        its shardings, and `eqxopt.abstract_state`."""
        abstract_model = jtu.tree_map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            eqx.filter(host_model, eqx.is_array),
            shardings(host_model, mesh, shard_over),
        )
        state = eqxopt.abstract_state(opt, abstract_model, shard_over=shard_over)
        return abstract_model, state

    def with_static(host_model, model, state):
        static = eqx.filter(host_model, eqx.is_array, inverse=True)
        return eqx.combine(model, static), state

    def restore(checkpointer, path, opt, host_model, mesh, shard_over):
        """Restore `(model, state)` onto `mesh`, from its abstract target."""
        abstract = target(opt, host_model, mesh, shard_over)
        restored = checkpointer.restore(path, abstract)
        for got, want in zip(jtu.tree_leaves(restored), jtu.tree_leaves(abstract)):
            assert got.sharding.is_equivalent_to(want.sharding, got.ndim), (got, want)
        return with_static(host_model, *restored)

    def from_saved(name, opt, host_model, mesh, shard_over):
        """`(model, state)` on `mesh` from the arrays the train processes recorded
        at their checkpoint (`"{name}/saved{path}"` in `--saved`)."""
        abstract = target(opt, host_model, mesh, shard_over)
        with np.load(args.saved) as saved:
            leaves = [
                jax.device_put(saved[f"{name}/saved{jtu.keystr(path)}"], x.sharding)
                for path, x in jtu.tree_flatten_with_path(abstract)[0]
            ]
        model, state = jtu.tree_unflatten(jtu.tree_structure(abstract), leaves)
        return with_static(host_model, model, state)

    before, after = range(STEPS_BEFORE), range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER)
    # A smaller mesh for `reference` to restore onto: 4 of its 8 devices.
    other = jax.make_mesh(
        (4,), (AXIS,), axis_types=(AxisType.Auto,), devices=jax.devices()[:4]
    )
    with ocp.StandardCheckpointer() as checkpointer:
        optimizers = _optimizers()
        for name in args.optimizers.split(","):
            opt = optimizers[name]
            print(f"{args.mode}: {name}", file=sys.stderr, flush=True)
            over = AXIS if name in ZERO else None
            host_model = make_model()
            model_sh = shardings(host_model, mesh, over)
            model = to_global(host_model, model_sh)
            state_sh = eqxopt.state_shardings(
                opt, eqx.filter(model, eqx.is_array), shard_over=over
            )
            state = jax.jit(opt.init, out_shardings=state_sh)(
                eqx.filter(model, eqx.is_array)
            )
            if over is not None:
                # Every moment is split: each device holds 1/8 of it.
                for x in jtu.tree_leaves((state.mu, state.nu)):
                    assert x.addressable_shards[0].data.size * n_devices == x.size
            step = make_step(opt, model_sh, state_sh)
            path = f"{args.checkpoint}/{name}"
            if args.mode == "train":
                model, state = train(step, model, state, mesh, before)
                record(name, "saved", (model, state))
                # Every process writes its own shards of one checkpoint.
                checkpointer.save(path, eqx.filter((model, state), eqx.is_array))
                checkpointer.wait_until_finished()
                model, state = train(step, model, state, mesh, after)
                record(name, "straight", (model, state))
                # Restore by these processes, into fresh arrays.
                model, state = restore(checkpointer, path, opt, host_model, mesh, over)
                record(name, "restored", (model, state))
                model, state = train(step, model, state, mesh, after)
                record(name, "resumed", (model, state))
            else:
                model, state = train(step, model, state, mesh, [*before, *after])
                record(name, "straight", (model, state))
                model, state = restore(checkpointer, path, opt, host_model, other, over)
                record(name, "restored_other_mesh", (model, state))
                other_model_sh = shardings(host_model, other, over)
                other_state_sh = eqxopt.state_shardings(
                    opt, eqx.filter(model, eqx.is_array), shard_over=over
                )
                step = make_step(opt, other_model_sh, other_state_sh)
                model, state = train(step, model, state, other, after)
                record(name, "resumed_other_mesh", (model, state))
                # The same steps on the same mesh from the values the 2 processes
                # saved, taken from their `--out` instead of the checkpoint: the
                # restored run must continue bit-for-bit like this one.
                model, state = from_saved(name, opt, host_model, other, over)
                model, state = train(step, model, state, other, after)
                record(name, "continued_other_mesh", (model, state))
    if jax.process_index() == 0:
        np.savez(args.out, **results)


if __name__ == "__main__":
    sys.exit(main())
