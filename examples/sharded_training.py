"""Data-parallel plus model-parallel training of a small Equinox transformer over a
device mesh, with `eqxopt.AdamW` and with `eqxopt.Muon`.

The batch is split over the mesh axis "data" and the weights over "model"
(Megatron-style: attention heads and the MLP's hidden units are split, so each block
needs one all-reduce forward and one backward). The optimizer state is sharded like
the params (`eqxopt.state_shardings`), and the jitted step donates the model and the
state, so memory stays at params + state.

On a CPU this script fakes 8 devices (set before JAX is imported); on a multi-GPU or
TPU host it uses the real devices, unchanged.

    python examples/sharded_training.py [--steps N] [--quick]
"""

import os


if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import eqxopt


# --- the model -------------------------------------------------------------------


class Block(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, dim, heads, hidden, *, key):
        k1, k2, k3 = jr.split(key, 3)
        self.norm1 = eqx.nn.LayerNorm(dim)
        self.attention = eqx.nn.MultiheadAttention(heads, dim, key=k1)
        self.norm2 = eqx.nn.LayerNorm(dim)
        self.up = eqx.nn.Linear(dim, hidden, key=k2)
        self.down = eqx.nn.Linear(hidden, dim, key=k3)

    def __call__(self, x, mask):
        h = jax.vmap(self.norm1)(x)
        x = x + self.attention(h, h, h, mask=mask)
        h = jax.vmap(self.norm2)(x)
        return x + jax.vmap(self.down)(jax.nn.gelu(jax.vmap(self.up)(h)))


class Transformer(eqx.Module):
    embedding: eqx.nn.Embedding
    position: jax.Array
    blocks: tuple[Block, ...]
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, vocab, length, dim, heads, hidden, depth, *, key):
        keys = jr.split(key, depth + 3)
        self.embedding = eqx.nn.Embedding(vocab, dim, key=keys[0])
        self.position = 0.02 * jr.normal(keys[1], (length, dim))
        self.blocks = tuple(Block(dim, heads, hidden, key=k) for k in keys[3:])
        self.norm = eqx.nn.LayerNorm(dim)
        self.head = eqx.nn.Linear(dim, vocab, key=keys[2])

    def __call__(self, tokens):
        x = jax.vmap(self.embedding)(tokens) + self.position[: tokens.shape[0]]
        causal = jnp.tril(jnp.ones((tokens.shape[0], tokens.shape[0]), bool))
        for block in self.blocks:
            x = block(x, causal)
        return jax.vmap(self.head)(jax.vmap(self.norm)(x))


def param_specs(model: Transformer):
    """A PartitionSpec for every array of the model (Megatron-style over "model")."""
    rules = [
        # Equinox weights are (out, in): split the heads / hidden units...
        (("query_proj", "key_proj", "value_proj", "up"), "weight", P("model", None)),
        (("up",), "bias", P("model")),
        # ...and contract them on the way back (an all-reduce over "model").
        (("output_proj", "down"), "weight", P(None, "model")),
    ]

    def spec(path, leaf):
        if not eqx.is_array(leaf):
            return None
        names = [getattr(k, "name", None) for k in path]
        for owners, field, rule in rules:
            if names[-1] == field and len(names) > 1 and names[-2] in owners:
                return rule
        return P()  # embeddings, norms, head: replicated

    return jtu.tree_map_with_path(spec, model)


# --- the task: continue sequences x_{t+1} = (x_t + x_{t-1}) mod vocab ---------------


def make_batch(key, batch, length, vocab):
    first = jr.randint(key, (batch, 2), 0, vocab)
    seq = [first[:, 0], first[:, 1]]
    for _ in range(length - 1):
        seq.append((seq[-1] + seq[-2]) % vocab)
    seq = jnp.stack(seq, axis=1)
    return seq[:, :-1], seq[:, 1:]


def loss_fn(model, tokens, targets):
    logits = jax.vmap(model)(tokens)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)
    return -jnp.mean(picked[:, 1:])  # the first token cannot be predicted


# --- training ----------------------------------------------------------------------


def make_mesh():
    n = jax.device_count()
    model_size = 2 if n % 2 == 0 else 1
    return jax.make_mesh(
        (n // model_size, model_size),
        ("data", "model"),
        axis_types=(AxisType.Auto, AxisType.Auto),
    )


def make_model(cfg):
    return Transformer(
        cfg["vocab"],
        cfg["length"],
        cfg["dim"],
        cfg["heads"],
        cfg["hidden"],
        cfg["depth"],
        key=jr.key(0),
    )


def train(opt, name, model, cfg, mesh, steps):
    model_shardings = jtu.tree_map(
        lambda s: NamedSharding(mesh, s),
        param_specs(model),
        is_leaf=lambda x: isinstance(x, P),
    )
    model = eqx.filter_shard(model, model_shardings)  # place the weights
    state_shardings = eqxopt.state_shardings(opt, model)
    state = eqx.filter_jit(opt.init)(model)  # sharded like the params
    state = eqx.filter_shard(state, state_shardings)  # pins counters etc.
    batch_sharding = NamedSharding(mesh, P("data"))

    # The model and the state are donated: their buffers are reused for the outputs.
    @eqx.filter_jit(donate="all-except-first")
    def train_step(batch, model, state):
        tokens, targets = batch
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, tokens, targets)
        model, state = opt.step(model, grads, state)
        model = eqx.filter_shard(model, model_shardings)
        state = eqx.filter_shard(state, state_shardings)
        return model, state, loss

    key = jr.key(1)
    losses = []
    start = time.perf_counter()
    for step in range(steps):
        key, sub = jr.split(key)
        batch = make_batch(sub, cfg["batch"], cfg["length"], cfg["vocab"])
        batch = jax.device_put(batch, batch_sharding)
        model, state, loss = train_step(batch, model, state)
        losses.append(float(loss))
        if step % max(1, steps // 5) == 0 or step == steps - 1:
            print(f"  [{name}] step {step:4d}  loss {losses[-1]:.4f}")
    elapsed = time.perf_counter() - start

    # Every state buffer that mirrors a weight is split like that weight.
    weight = model.blocks[0].attention.query_proj.weight
    mirrors = _mirror_shardings(state, model.blocks[0].attention.query_proj.weight)
    sharded_like = bool(mirrors) and all(
        s.is_equivalent_to(weight.sharding, 2) for s in mirrors
    )
    print(
        f"  [{name}] {steps} steps in {elapsed:.1f}s; loss {losses[0]:.3f} -> "
        f"{losses[-1]:.3f}; query weight {weight.sharding.spec}, its "
        f"{len(mirrors)} state buffer(s) sharded like it: {sharded_like}"
    )
    return losses, sharded_like


def _mirror_shardings(state, weight):
    """Shardings of the state leaves at `.blocks[0].attention.query_proj.weight`."""
    return [
        leaf.sharding
        for path, leaf in jtu.tree_leaves_with_path(state)
        if jtu.keystr(path).endswith(".blocks[0].attention.query_proj.weight")
        and leaf.shape == weight.shape
    ]


def main(steps=None, quick=False):
    if quick:
        cfg = dict(vocab=16, length=16, dim=32, heads=4, hidden=64, depth=1, batch=16)
        steps = steps or 30
    else:
        cfg = dict(vocab=32, length=32, dim=64, heads=4, hidden=256, depth=2, batch=64)
        steps = steps or 300
    mesh = make_mesh()
    print(f"{jax.device_count()} devices, mesh {dict(mesh.shape)}")

    model = make_model(cfg)
    # Muon for the 2-D weights inside the blocks; AdamW (Muon's fallback) for the
    # embeddings, the head, norms and biases. A filter spec: a tree of bools.
    block_matrices = eqx.tree_at(
        lambda m: m.blocks,
        jtu.tree_map(lambda _: False, model),
        jtu.tree_map(lambda x: eqx.is_array(x) and x.ndim == 2, model.blocks),
    )
    optimizers = {
        "AdamW": eqxopt.AdamW(1e-2, weight_decay=0.01, mask=lambda p: p.ndim == 2),
        "Muon": eqxopt.Muon(0.05, weight_decay=0.01, matrix_mask=block_matrices),
    }
    results = {}
    for name, opt in optimizers.items():
        results[name] = train(opt, name, model, cfg, mesh, steps)
    for name, (losses, sharded_like) in results.items():
        assert losses[-1] < 0.85 * losses[0], f"{name} did not train: {losses}"
        assert sharded_like, f"{name}'s state is not sharded like the params"
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="a few steps, for CI")
    args = parser.parse_args()
    main(args.steps, args.quick)
