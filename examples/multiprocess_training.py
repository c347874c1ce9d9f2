"""Multi-process (multi-host) FSDP training with eqxopt and JAX's own distributed
runtime, with an Orbax checkpoint written by every process.

Every process runs this same script. `jax.distributed.initialize` connects them; the
mesh spans the devices of all processes; each process feeds its own slice of the
global batch; the params (and so eqxopt's state) are sharded over all devices.
eqxopt needs nothing beyond sharded params.

On one machine, with CPU devices (the script starts its own processes):

    python examples/multiprocess_training.py --processes 2 [--steps N] [--quick]

On a cluster, start one process per host yourself, with the coordinator's address:

    # on every host, with PROCESS_ID = 0 .. NUM_PROCESSES - 1
    python examples/multiprocess_training.py --coordinator host0:1234 \\
        --num-processes NUM_PROCESSES --process-id PROCESS_ID

Under SLURM (`srun`), on a TPU pod slice, or with the `JAX_COORDINATOR_ADDRESS`,
`JAX_NUM_PROCESSES` and `JAX_PROCESS_ID` environment variables set, pass `--auto`:
`jax.distributed.initialize()` then finds everything itself. See docs/scaling.md.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--processes", type=int, default=0, help="start N local ones")
    parser.add_argument("--coordinator", help="host:port of process 0")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--auto", action="store_true", help="SLURM, TPU, JAX_* vars")
    parser.add_argument("--cpu-devices", type=int, default=4, help="per process, CPU")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--checkpoint", help="directory (default: a temporary one)")
    parser.add_argument("--quick", action="store_true", help="a few steps")
    args = parser.parse_args()
    if args.quick:  # a quick check on this machine: 2 local processes, 4 steps
        args.steps = 4
        if not (args.processes or args.coordinator or args.auto):
            args.processes = 2
    if args.processes:
        return launch_locally(args)
    return train(args)


def launch_locally(args) -> int:
    """Start `args.processes` copies of this script on this machine, with CPU devices,
    a localhost coordinator and one shared checkpoint directory."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or os.path.join(tmp, "checkpoint")
        # More CPU threads than devices: a device waiting in a cross-process
        # collective keeps its thread (see docs/scaling.md, "One machine, several
        # processes").
        env = dict(os.environ, JAX_PLATFORMS="cpu", NPROC="16")
        flags = [  # keep the caller's other XLA flags
            flag
            for flag in os.environ.get("XLA_FLAGS", "").split()
            if not flag.startswith("--xla_force_host_platform_device_count")
        ]
        flags.append(f"--xla_force_host_platform_device_count={args.cpu_devices}")
        env["XLA_FLAGS"] = " ".join(flags)
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--coordinator",
                    f"localhost:{port}",
                    "--num-processes",
                    str(args.processes),
                    "--process-id",
                    str(i),
                    "--steps",
                    str(args.steps),
                    "--checkpoint",
                    checkpoint,
                ],  # fmt: skip
                env=env,
            )
            for i in range(args.processes)
        ]
        try:
            codes = [p.wait(timeout=600) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    failed = [i for i, c in enumerate(codes) if c != 0]
    if failed:
        print(f"processes {failed} failed", file=sys.stderr)
        return 1
    return 0


def train(args) -> int:
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import jax.random as jr
    import jax.tree_util as jtu
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import eqxopt

    # 1. Connect the processes. With no arguments, JAX detects SLURM, TPU pods and
    # the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables.
    if args.auto:
        jax.distributed.initialize()
    elif args.coordinator:
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
        )
    rank, world = jax.process_index(), jax.process_count()

    def log(*msg):
        if rank == 0:
            print(*msg, flush=True)

    # 2. One mesh over every device of every process.
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("fsdp",), axis_types=(AxisType.Auto,))
    log(f"{world} processes, {n} devices ({jax.local_device_count()} per process)")

    # 3. The model, with every weight sharded over the mesh (FSDP). Every process
    # builds the same model from the same key and keeps only its own shards.
    model = eqx.nn.MLP(32, 8, 64, 2, activation=jax.nn.gelu, key=jr.key(0))

    def sharding(x):
        if eqx.is_inexact_array(x):
            split = x.ndim >= 1 and x.shape[0] % n == 0
            return NamedSharding(mesh, P("fsdp") if split else P())
        return None

    model_sh = jtu.tree_map(sharding, model)

    def to_global(x, s):
        if s is None:
            return x
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, s, lambda i: host[i])

    model = jtu.tree_map(to_global, model, model_sh, is_leaf=lambda x: x is None)

    # 4. The optimizer: its state is sharded like the params, nothing else to do.
    opt = eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.AdamW(learning_rate=3e-3))
    params = eqx.filter(model, eqx.is_array)
    state_sh = eqxopt.state_shardings(opt, params)
    state = jax.jit(opt.init, out_shardings=state_sh)(params)

    @eqx.filter_jit(donate="all-except-first")
    def step(batch, model, state):
        x, y = batch

        def loss_fn(model):
            return jnp.mean((jax.vmap(model)(x) - y) ** 2)

        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        model, state = opt.step(model, grads, state)
        model = eqx.filter_shard(model, model_sh)
        return model, eqx.filter_shard(state, state_sh), loss

    # 5. Each process loads only its part of the global batch.
    batch_sh = NamedSharding(mesh, P("fsdp"))
    per_process = 16 * jax.local_device_count()
    teacher = jr.normal(jr.key(1), (32, 8))

    def local_batch(i):
        key = jr.fold_in(jr.fold_in(jr.key(2), i), rank)
        x = jr.normal(key, (per_process, 32))
        return np.asarray(x), np.asarray(jnp.tanh(x @ teacher))

    def global_batch(i):
        x, y = local_batch(i)
        return (
            jax.make_array_from_process_local_data(batch_sh, x),
            jax.make_array_from_process_local_data(batch_sh, y),
        )

    for i in range(args.steps):
        model, state, loss = step(global_batch(i), model, state)
        if i % 5 == 0 or i == args.steps - 1:
            log(f"step {i:3d}  loss {float(loss):.4f}")

    # 6. Checkpoint with Orbax: every process writes its own shards of one
    # checkpoint (on a cluster, a directory every host can reach), and restores into
    # an abstract target. `eqxopt.check_checkpoint` first makes sure that the
    # checkpoint fits the target, and names the first path where it does not.
    import orbax.checkpoint as ocp

    directory = args.checkpoint or os.path.join(tempfile.gettempdir(), "eqxopt_mp")
    path = os.path.abspath(os.path.join(directory, f"step_{args.steps}"))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, eqx.filter((model, state), eqx.is_array), force=True)
        checkpointer.wait_until_finished()
        abstract_model = jtu.tree_map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            eqx.filter(model, eqx.is_array),
            model_sh,
        )
        target = (abstract_model, eqxopt.abstract_state(opt, abstract_model))
        eqxopt.check_checkpoint(path, target)
        restored_params, restored_state = checkpointer.restore(path, target)
    restored = eqx.combine(restored_params, model)
    model, state, loss = step(global_batch(args.steps), model, state)
    _, _, resumed_loss = step(global_batch(args.steps), restored, restored_state)
    log(f"restored from {path}; next loss {float(resumed_loss):.4f}")
    assert float(resumed_loss) == float(loss)  # continues bit-for-bit
    if args.coordinator or args.auto:
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
