"""A character-level language model on the standard library's source: AdamW against
the matrix methods (Muon, NorMuon, SOAP, Shampoo, Kron).

The data ships with every Python: a fixed list of CPython 3.10+ standard-library
source files (found through `sysconfig.get_paths()["stdlib"]`), read as bytes. The
training files and the validation files are disjoint (`TRAIN_FILES`, `VALID_FILES`).
The model is a small decoder-only transformer written with Equinox (byte embedding,
learned positions, pre-norm blocks of causal self-attention and a GELU MLP, an
untied head; weights in Equinox's `(out, in)` layout).

Every optimizer gets the same initial model, the same batches in the same order, the
same number of steps and the same schedule shape (linear warm-up over the first 10%
of the steps, cosine decay to 10% of the peak), and a small sweep of peak learning
rates. Muon and NorMuon take the 2-D hidden weights (attention and MLP matrices);
the embeddings, the head and the norms go to their AdamW fallback (at AdamW's middle
learning rate), as `docs/muon.md` ("Routing") describes. SOAP, Shampoo and Kron
precondition every leaf, as their references do. No weight decay anywhere.

It prints, for every optimizer at its best learning rate (lowest final validation
loss):

- the final validation loss (mean cross-entropy per byte, in nats);
- the first evaluation step at which the validation loss reaches AdamW's final one,
  as a fraction of the step budget ("steps to AdamW's loss");
- the train step time (forward, backward and update; jitted, donated), timed after
  the sweep in interleaved rounds (`_common.interleaved`), and its ratio to AdamW's;
- the state's bytes (`eqxopt.verify`), per parameter and relative to AdamW's;
- Muon's train step with `eqxopt.Muon` against the same step with
  `optax.contrib.muon` (same routing, same work), interleaved: the ratio eqxopt/Optax.

The wall-clock panel of the plot puts every optimizer's curve at
`step x its median step time` from the interleaved timing: the training runs
themselves are one after the other, so on a shared machine their own clocks measure
the load as much as the optimizer (their measured seconds are printed too).

`--precision` trains AdamW alone, at one peak learning rate (`--lr`, or the best of
its sweep with float32), in seven configurations: float32 params and state (the
reference), int8, int4 and fp8 state (`eqxopt.Quantized`), and bfloat16 params with
float32 state, plainly rounded, with `eqxopt.StochasticRounding` and with
`eqxopt.Compensated` (the forward and backward in float32 on the params upcast);
with `--only`, also fp8 for one moment and int8 for the other (`fp8_int8`,
`int8_fp8`). Same initial model (rounded to bfloat16 for those), batches, steps and
schedule; `--seeds N` repeats it for seeds 0..N-1. It prints the final validation
losses, their difference to float32's, the state's bytes per param and the targets
of `docs/memory_precision.md` ("Loss at equal steps").

    python benchmarks/lm.py --quick                 # a tiny model, CI (seconds)
    python benchmarks/lm.py --plot                   # the default sweep
    python benchmarks/lm.py --plot --docs docs/matrix.md --json lm.json
    python benchmarks/lm.py --only adamw,muon --steps 600 --width 192
    python benchmarks/lm.py --precision --steps 400 --seeds 3 --plot \
        --docs docs/memory_precision.md
"""

import argparse
import json
import math
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (puts the repository root on sys.path)
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import optax

import eqxopt


# Files present in every CPython 3.10+ (paths relative to the stdlib directory).
TRAIN_FILES = (
    "argparse.py",
    "dataclasses.py",
    "functools.py",
    "inspect.py",
    "typing.py",
    "enum.py",
    "threading.py",
    "random.py",
    "statistics.py",
    "textwrap.py",
    "shutil.py",
    "tempfile.py",
    "heapq.py",
    "contextlib.py",
    "copy.py",
    "subprocess.py",
    "collections/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "logging/__init__.py",
    "abc.py",
    "string.py",
    "os.py",
    "configparser.py",
    "fractions.py",
)
VALID_FILES = ("difflib.py", "calendar.py", "csv.py")

STANDARD = lambda: jax.numpy_dtype_promotion("standard")  # Optax is not strict-clean


def load_corpus() -> tuple[np.ndarray, np.ndarray]:
    """The training and validation bytes, as `uint8` arrays."""
    root = Path(sysconfig.get_paths()["stdlib"])

    def read(names):
        return np.frombuffer(
            b"\n".join((root / n).read_bytes() for n in names), np.uint8
        )

    return read(TRAIN_FILES), read(VALID_FILES)


# --- the model ----------------------------------------------------------------------


class Block(eqx.Module):
    ln1: eqx.nn.LayerNorm
    qkv: eqx.nn.Linear
    out: eqx.nn.Linear
    ln2: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear
    heads: int = eqx.field(static=True)

    def __init__(self, width: int, heads: int, key):
        k1, k2, k3, k4 = jr.split(key, 4)
        self.ln1 = eqx.nn.LayerNorm(width)
        self.qkv = eqx.nn.Linear(width, 3 * width, key=k1)
        self.out = eqx.nn.Linear(width, width, key=k2)
        self.ln2 = eqx.nn.LayerNorm(width)
        self.up = eqx.nn.Linear(width, 4 * width, key=k3)
        self.down = eqx.nn.Linear(4 * width, width, key=k4)
        self.heads = heads

    def __call__(self, x):  # x: (T, d)
        T, d = x.shape
        h = jax.vmap(self.ln1)(x)
        q, k, v = jnp.split(jax.vmap(self.qkv)(h), 3, axis=-1)
        q, k, v = (a.reshape(T, self.heads, d // self.heads) for a in (q, k, v))
        scores = jnp.einsum("thc,shc->hts", q, k) / math.sqrt(d // self.heads)
        causal = jnp.tril(jnp.ones((T, T), bool))
        scores = jnp.where(causal, scores, -jnp.inf)
        att = jnp.einsum("hts,shc->thc", jax.nn.softmax(scores, axis=-1), v)
        x = x + jax.vmap(self.out)(att.reshape(T, d))
        h = jax.vmap(self.ln2)(x)
        return x + jax.vmap(self.down)(jax.nn.gelu(jax.vmap(self.up)(h)))


class Transformer(eqx.Module):
    embed: eqx.nn.Embedding
    pos: jax.Array
    blocks: tuple[Block, ...]
    ln_f: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, width: int, layers: int, heads: int, context: int, key):
        keys = jr.split(key, layers + 3)
        self.embed = eqx.nn.Embedding(256, width, key=keys[0])
        self.pos = 0.02 * jr.normal(keys[1], (context, width))
        self.blocks = tuple(Block(width, heads, k) for k in keys[3:])
        self.ln_f = eqx.nn.LayerNorm(width)
        self.head = eqx.nn.Linear(width, 256, use_bias=False, key=keys[2])

    def __call__(self, tokens):  # tokens: (T,) int32 -> logits (T, 256)
        x = jax.vmap(self.embed)(tokens) + self.pos[: tokens.shape[0]]
        for block in self.blocks:
            x = block(x)
        return jax.vmap(self.head)(jax.vmap(self.ln_f)(x))


def hidden_matrix_mask(model: Transformer):
    """`True` at the 2-D weights of the blocks (Muon's), `False` elsewhere."""
    mask = jtu.tree_map(lambda _: False, model)
    return eqx.tree_at(
        lambda m: (
            [w for b in m.blocks for w in (b.qkv.weight, b.out.weight, b.up.weight)]
            + [b.down.weight for b in m.blocks]
        ),
        mask,
        [True] * (4 * len(model.blocks)),
    )


def batch_loss(model, data, offsets, context):
    """Mean next-byte cross-entropy (nats) of the windows starting at `offsets`."""
    idx = offsets[:, None] + jnp.arange(context + 1)
    seq = data[idx].astype(jnp.int32)
    logits = jax.vmap(model)(seq[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, seq[:, 1:]).mean()


def init_model(cfg, seed: int) -> Transformer:
    return Transformer(cfg.width, cfg.layers, cfg.heads, cfg.context, jr.key(seed))


def train_offsets(cfg, n_train: int, seed: int) -> jax.Array:
    """The start of every training window, `(steps, batch)`: the batches' order."""
    rng = np.random.default_rng(seed)
    high = n_train - cfg.context - 1
    return jnp.asarray(rng.integers(0, high, (cfg.steps, cfg.batch)), jnp.int32)


# --- the optimizers -------------------------------------------------------------------


def schedule(peak: float, steps: int):
    warmup = max(1, steps // 10)
    return eqxopt.schedules.WarmupCosineDecay(0.0, peak, warmup, steps, 0.1 * peak)


# name -> (learning rates of the sweep, label, `(lr, steps, model, adamw_lr) -> opt`)
# (the peak learning rate is a float32 array: see `make_opt`)
Factory = Callable[[jax.Array, int, Transformer, float], eqxopt.AbstractOptimizer]


def _adamw(lr, steps, model, adamw_lr):
    return eqxopt.AdamW(schedule(lr, steps), b1=0.9, b2=0.95, weight_decay=0.0)


def _muon(cls):
    def make(lr, steps, model, adamw_lr):
        return cls(
            schedule(lr, steps),
            matrix_mask=hidden_matrix_mask(model),
            fallback=_adamw(adamw_lr, steps, model, adamw_lr),
        )

    return make


def _soap(lr, steps, model, adamw_lr):
    return eqxopt.SOAP(schedule(lr, steps), b1=0.95, b2=0.95, weight_decay=0.0)


def _shampoo(lr, steps, model, adamw_lr):
    # Adam-like grafting (RMSProp), blocks of at most 128 x 128, the statistics'
    # inverse roots every 10 steps.
    return eqxopt.Shampoo(
        schedule(lr, steps),
        block_size=128,
        b1=0.9,
        b2=0.95,
        graft_type="rmsprop",
        preconditioning_compute_steps=10,
    )


def _kron(lr, steps, model, adamw_lr):
    return eqxopt.Kron(schedule(lr, steps), b1=0.9)


OPTIMIZERS: dict[str, tuple[tuple[float, ...], str, Factory]] = {
    "adamw": ((1e-3, 2e-3, 4e-3), "AdamW", _adamw),
    "muon": ((0.01, 0.02, 0.04), "Muon", _muon(eqxopt.Muon)),
    "normuon": ((0.01, 0.02, 0.04), "NorMuon", _muon(eqxopt.NorMuon)),
    "soap": ((1e-3, 2e-3, 4e-3), "SOAP", _soap),
    "shampoo": ((1e-3, 2e-3, 4e-3), "Shampoo", _shampoo),
    "kron": ((5e-4, 1e-3, 2e-3), "Kron", _kron),
}


def optax_muon(lr: float, model: Transformer):
    """`optax.contrib.muon` doing eqxopt's Muon work on this model: the hidden
    matrices in the `(out, in)` layout, Adam with AdamW's settings elsewhere."""
    dims = optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=0)
    mask = hidden_matrix_mask(model)
    return optax.contrib.muon(
        lr,
        adam_b1=0.9,
        adam_b2=0.95,
        # A function of the params (the tree itself, a callable Module, would be
        # taken for one).
        muon_weight_dimension_numbers=lambda params: jtu.tree_map(
            lambda m: dims if m else None, mask
        ),
    )


# --- training ---------------------------------------------------------------------


def train_step(update: Callable, data, context: int, context_manager=None):
    """`(model, state, offsets) -> (model, state, loss)`, where
    `update(grads, state, model) -> (updates, state)`; not jitted."""

    def step(model, state, offsets):
        loss, grads = eqx.filter_value_and_grad(batch_loss)(
            model, data, offsets, context
        )
        if context_manager is None:
            updates, state = update(grads, state, model)
        else:
            with context_manager():
                updates, state = update(grads, state, model)
        return eqx.apply_updates(model, updates), state, loss

    return step


def make_opt(name: str, lr: float, cfg, model) -> eqxopt.AbstractOptimizer:
    # The peak learning rate is an array, so that one compiled step serves the
    # whole sweep (the optimizer's arrays are an argument of the step).
    return OPTIMIZERS[name][2](
        jnp.asarray(lr, jnp.float32), cfg.steps, model, cfg.adamw_lr
    )


class Compiled:
    """One optimizer's train step, compiled once: `(opt, model, state, offsets)`."""

    def __init__(self, name, cfg, model0, data, offsets):
        opt = make_opt(name, OPTIMIZERS[name][0][0], cfg, model0)
        dynamic, static = eqx.partition(opt, eqx.is_array)
        self.static = static

        def step(dynamic, model, state, offsets):
            opt = eqx.combine(dynamic, static)
            return train_step(opt.update, data, cfg.context)(model, state, offsets)

        model = C.fresh_copy(model0)
        t0 = time.perf_counter()
        self.fn = (
            jax.jit(step, donate_argnums=(1, 2))
            .lower(dynamic, model, opt.init(model), offsets[0])
            .compile()
        )
        self.seconds = time.perf_counter() - t0

    def bind(self, opt):
        """`(model, state, offsets) -> (model, state, loss)` for `opt` (one of the
        sweep's: the same static part)."""
        dynamic, static = eqx.partition(opt, eqx.is_array)
        assert jtu.tree_structure(static) == jtu.tree_structure(self.static)
        return lambda model, state, offsets: self.fn(dynamic, model, state, offsets)


def train(cfg, name, lr, compiled, evaluate, model0, offsets):
    """One run of the sweep: the validation curve and the time spent training."""
    opt = make_opt(name, lr, cfg, model0)
    model = C.fresh_copy(model0)
    run = run_steps(cfg, compiled.bind(opt), model, opt.init(model), evaluate, offsets)
    return {"optimizer": name, "lr": lr, **run}


def run_steps(cfg, step, model, state, evaluate, offsets):
    """`cfg.steps` steps of `step(model, state, offsets) -> (model, state, loss)`, the
    validation loss every `cfg.eval_every` steps: the curve `[(step, loss, seconds)]`,
    the final loss (NaN when it diverged) and the seconds spent training."""
    curve = [(0, float(evaluate(model)), 0.0)]
    train_s = 0.0
    diverged = False
    for k in range(cfg.steps):
        t0 = time.perf_counter()
        model, state, loss = step(model, state, offsets[k])
        if (k + 1) % cfg.eval_every == 0 or k + 1 == cfg.steps:
            loss.block_until_ready()
            train_s += time.perf_counter() - t0
            valid = float(evaluate(model))
            curve.append((k + 1, valid, train_s))
            if not math.isfinite(valid):
                diverged = True
                break
        else:
            train_s += time.perf_counter() - t0
    return {
        "curve": curve,
        "final": curve[-1][1] if not diverged else math.nan,
        "diverged": diverged,
        "train_seconds": train_s,
    }


def steps_to_reach(curve, target: float) -> int | None:
    for k, valid, _ in curve:
        if k > 0 and valid <= target:
            return k
    return None


# --- reporting ----------------------------------------------------------------------


def plot(results, best, step_ms, path, caption):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    cmap = plt.get_cmap("tab10")
    lows, highs = [], []
    for i, name in enumerate(best):
        run = best[name]
        ks = np.array([c[0] for c in run["curve"]])
        vs = np.array([c[1] for c in run["curve"]])
        label = f"{OPTIMIZERS[name][1]} (lr {run['lr']:g})"
        axes[0].plot(ks, vs, color=cmap(i), label=label, lw=1.6)
        seconds = ks * step_ms[name] / 1e3
        axes[1].plot(seconds, vs, color=cmap(i), label=label, lw=1.6)
        finite = vs[np.isfinite(vs)]
        if finite.size:
            lows.append(finite.min())
            highs.append(finite[min(1, finite.size - 1)])
    if lows:
        lo, hi = min(lows), max(highs)
        axes[0].set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    axes[0].set_xlabel("training step", fontsize=11)
    axes[1].set_xlabel("time (step x median step time, s)", fontsize=11)
    axes[0].set_ylabel("validation loss (nats per byte)", fontsize=11)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=10)
    axes[1].legend(fontsize=10, loc="upper right", frameon=True)
    fig.suptitle(caption, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- precision mode (`--precision`) ---------------------------------------------------

# name -> (label, param dtype, AdamW's `state_dtype`, wrapper, target); a target `x`
# is "final validation loss at most x% above float32's", "worse" is "more than
# WORSE% above" (plain bfloat16 params must lose measurably).
WORSE = 0.5
PRECISIONS = {
    "float32": ("float32 (reference)", jnp.float32, None, None, None),
    "int8": ("int8 state", jnp.float32, eqxopt.Quantized("int8"), None, 0.5),
    "int4": ("int4 state", jnp.float32, eqxopt.Quantized("int4"), None, 1.5),
    "fp8": ("fp8 state", jnp.float32, eqxopt.Quantized("fp8"), None, 1.5),
    # fp8 for one moment, int8 for the other (the same memory).
    "fp8_int8": (
        "fp8 first moment, int8 second",
        jnp.float32,
        {"mu": eqxopt.Quantized("fp8"), "nu": eqxopt.Quantized("int8")},
        None,
        1.5,
    ),
    "int8_fp8": (
        "int8 first moment, fp8 second",
        jnp.float32,
        {"mu": eqxopt.Quantized("int8"), "nu": eqxopt.Quantized("fp8")},
        None,
        1.5,
    ),
    "bf16": ("bfloat16 params", jnp.bfloat16, jnp.float32, None, "worse"),
    "bf16_sr": (
        "bfloat16 + StochasticRounding",
        jnp.bfloat16,
        jnp.float32,
        lambda opt: eqxopt.StochasticRounding(opt, key=0),
        0.5,
    ),
    "bf16_comp": (
        "bfloat16 + Compensated",
        jnp.bfloat16,
        jnp.float32,
        eqxopt.Compensated,
        0.5,
    ),
}


# Run only when named in `--only`: fp8 for one moment and int8 for the other.
ONLY_ASKED = ("fp8_int8", "int8_fp8")


def cast(tree, dtype):
    """Every float array of `tree` in `dtype`."""
    return jtu.tree_map(
        lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, tree
    )


def precision_opt(name: str, lr: float, steps: int) -> eqxopt.AbstractOptimizer:
    _, _, state_dtype, wrapper, _ = PRECISIONS[name]
    opt = eqxopt.AdamW(
        schedule(lr, steps), b1=0.9, b2=0.95, weight_decay=0.0, state_dtype=state_dtype
    )
    return opt if wrapper is None else wrapper(opt)


def precision_step(opt, data, context: int):
    """The train step of the precision mode: the forward and backward in float32 on
    the params upcast (float32 gradients), then `opt.step` writes the params in their
    own dtype; not jitted."""

    def step(model, state, offsets):
        loss, grads = eqx.filter_value_and_grad(batch_loss)(
            cast(model, jnp.float32), data, offsets, context
        )
        model, state = opt.step(model, grads, state)
        return model, state, loss

    return step


def target_met(target, diff: float) -> bool | None:
    if target is None:
        return None
    if target == "worse":
        return diff > WORSE
    return diff <= target


def target_text(target) -> str:
    if target is None:
        return "-"
    if target == "worse":
        return f"> +{WORSE:g}% (worse)"
    return f"<= +{target:g}%"


def plot_precision(runs, names, path, caption):
    """Left: the validation loss over the second half of the run; right: its
    difference to float32's from a quarter of the run on (means over the seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    cmap = plt.get_cmap("tab10")
    styles = {"int8": "--", "int4": "--", "fp8": "--"}

    def mean_curve(name):
        return np.mean([[c[1] for c in r["curve"]] for r in runs[name]], axis=0)

    ks = np.array([c[0] for c in runs["float32"][0]["curve"]])
    ref = mean_curve("float32")
    late, warm = ks >= ks[-1] // 2, ks >= ks[-1] // 4
    for name in names:
        vs = mean_curve(name)
        color = cmap(list(PRECISIONS).index(name))  # the same in every plot
        kw = dict(color=color, lw=1.6, ls=styles.get(name, "-"))
        axes[0].plot(ks[late], vs[late], label=PRECISIONS[name][0], **kw)
        axes[1].plot(ks[warm], vs[warm] - ref[warm], label=PRECISIONS[name][0], **kw)
    axes[0].set_title("validation loss, second half", fontsize=10)
    axes[1].set_title("minus float32's, from a quarter of the run on", fontsize=10)
    for ax in axes:
        ax.set_xlabel("training step", fontsize=11)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=10)
    axes[0].set_ylabel("nats per byte", fontsize=11)
    axes[0].legend(fontsize=9, loc="upper right", frameon=True)
    fig.suptitle(caption, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def precision_main(args, cfg, info, train_data, train_dev, evaluate):
    """AdamW at one learning rate, float32 against quantized state and bfloat16
    params: the same init, batches, steps and schedule for each configuration."""
    default = [n for n in PRECISIONS if n not in ONLY_ASKED]
    names = default if args.only is None else args.only.split(",")
    if "float32" not in names:
        names.insert(0, "float32")
    seeds = list(range(args.seeds))
    model0 = init_model(cfg, seeds[0])
    n_params = sum(x.size for x in jtu.tree_leaves(model0))
    lr = args.lr
    if lr is None and args.quick:
        lr = OPTIMIZERS["adamw"][0][1]
    if lr is None:
        # AdamW's sweep of the main mode, float32, first seed.
        offsets = train_offsets(cfg, len(train_data), seeds[0])
        compiled = Compiled("adamw", cfg, model0, train_dev, offsets)
        finals = {}
        for x in OPTIMIZERS["adamw"][0]:
            finals[x] = train(cfg, "adamw", x, compiled, evaluate, model0, offsets)[
                "final"
            ]
            print(f"  sweep: AdamW lr {x:g}, float32: {C.fmt(finals[x], 4)}")
        lr = min(finals, key=lambda x: finals[x] if math.isfinite(finals[x]) else 1e9)
    print(f"AdamW, peak learning rate {lr:g}; seeds {seeds}\n")

    evaluate32 = lambda model: evaluate(cast(model, jnp.float32))
    runs = {name: [] for name in names}
    bytes_per_param = {}
    compile_s = {}
    for name in names:
        dtype = PRECISIONS[name][1]
        opt = precision_opt(name, lr, cfg.steps)
        model = cast(model0, dtype)
        bytes_per_param[name] = eqxopt.verify(opt, model).nbytes / n_params
        t0 = time.perf_counter()
        step = (
            jax.jit(precision_step(opt, train_dev, cfg.context), donate_argnums=(0, 1))
            .lower(model, opt.init(model), train_offsets(cfg, len(train_data), 0)[0])
            .compile()
        )
        compile_s[name] = time.perf_counter() - t0
        for seed in seeds:
            model = cast(init_model(cfg, seed), dtype)
            offsets = train_offsets(cfg, len(train_data), seed)
            run = run_steps(cfg, step, model, opt.init(model), evaluate32, offsets)
            runs[name].append({"seed": seed, **run})
            print(
                f"  {PRECISIONS[name][0]:30s} seed {seed}: final validation loss "
                f"{C.fmt(run['final'], 4)}  [{run['train_seconds']:.1f} s training; "
                f"compile {compile_s[name]:.1f} s]",
                flush=True,
            )

    ref = [r["final"] for r in runs["float32"]]
    rows = []
    summary = {}
    for name in names:
        label, dtype, _, _, target = PRECISIONS[name]
        finals = [r["final"] for r in runs[name]]
        diffs = [100 * (f / f0 - 1) for f, f0 in zip(finals, ref)]
        diff = float(np.mean(diffs))
        met = None if name == "float32" else target_met(target, diff)
        summary[name] = {
            "label": label,
            "param_dtype": jnp.dtype(dtype).name,
            "final": float(np.mean(finals)),
            "finals": finals,
            "diff_percent": diff,
            "diff_percent_per_seed": diffs,
            "state_bytes_per_param": bytes_per_param[name],
            "target": target,
            "met": met,
            "train_seconds": sum(r["train_seconds"] for r in runs[name]),
        }
        row = [
            label,
            f"{jnp.dtype(dtype).itemsize}",
            f"{bytes_per_param[name]:.2f}",
            C.fmt(float(np.mean(finals)), 4),
            "-" if name == "float32" else f"{diff:+.2f}",
        ]
        if len(seeds) > 1:
            row.append(", ".join(f"{d:+.2f}" for d in diffs))
        row += [target_text(target), "-" if met is None else ("yes" if met else "no")]
        rows.append(row)
    headers = [
        "configuration",
        "param bytes",
        "state bytes / param",
        "final valid loss" + (" (mean)" if len(seeds) > 1 else ""),
        "vs float32 (%)",
    ]
    if len(seeds) > 1:
        headers.append("per seed (%)")
    headers += ["target", "met"]
    main_table = C.table(headers, rows)
    print("\n" + main_table)

    if args.plot:
        path = args.plot_path or str(
            C.repo_root() / "docs/_static/bench_lm_precision.png"
        )
        caption = (
            f"AdamW lr {lr:g}, {cfg.steps} steps; {cfg.layers} layers, width "
            f"{cfg.width}, {C.human(n_params)} params, batch {cfg.batch}x{cfg.context}"
            + (f"; mean of {len(seeds)} seeds" if len(seeds) > 1 else "")
        )
        plot_precision(runs, names, path, caption)
        print(f"\nplot: {path}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": info,
                    "config": vars(cfg),
                    "n_params": n_params,
                    "lr": lr,
                    "seeds": seeds,
                    "runs": runs,
                    "summary": summary,
                    "compile_seconds": compile_s,
                },
                indent=1,
            )
        )
    if args.docs:
        text = (
            f"Measured with `python benchmarks/lm.py --precision` on {info['cpu']} "
            f"({info['cores']} cores, {info['backend']}; jax {info['jax']}): "
            f"{cfg.layers} layers, width {cfg.width}, context {cfg.context}, "
            f"{n_params:,} params; batch {cfg.batch} windows, {cfg.steps} steps, "
            f"AdamW at peak learning rate {lr:g}; "
            + (
                f"seeds {', '.join(map(str, seeds))} (init and batch order), the mean "
                "of the per-seed differences"
                if len(seeds) > 1
                else f"seed {seeds[0]}"
            )
            + "; validation loss in nats per byte.\n\n"
            + main_table
        )
        C.write_docs_section(args.docs, args.docs_section or "lm.py precision", text)


def main():
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model (CI)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--context", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--only", default=None, help="comma-separated optimizers")
    parser.add_argument("--repeats", type=int, default=None, help="timing rounds")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--plot", action="store_true", help="write the PNG")
    parser.add_argument("--plot-path", default=None)
    parser.add_argument("--docs", default=None, help="rewrite `lm.py` in this page")
    parser.add_argument(
        "--precision",
        action="store_true",
        help="AdamW with quantized state and bfloat16 params against float32",
    )
    parser.add_argument("--lr", type=float, default=None, help="(--precision)")
    parser.add_argument("--seeds", type=int, default=1, help="(--precision)")
    parser.add_argument(
        "--docs-section", default=None, help="the section's name (--precision)"
    )
    args = parser.parse_args()
    quick = args.quick

    cfg = argparse.Namespace(
        steps=args.steps or (30 if quick else 200),
        width=args.width or (32 if quick else 64),
        layers=args.layers or (1 if quick else 2),
        heads=2 if quick else 4,
        context=args.context or (16 if quick else 64),
        batch=args.batch or (8 if quick else 16),
        eval_every=10 if quick else 10,
        valid_batches=2 if quick else 8,
        adamw_lr=OPTIMIZERS["adamw"][0][1],
    )
    names = list(OPTIMIZERS) if args.only is None else args.only.split(",")
    if "adamw" not in names:
        names.insert(0, "adamw")  # the reference of every ratio
    repeats = args.repeats or (3 if quick else 7)

    info = C.machine_info()
    print(C.machine_line(info))
    train_data, valid_data = load_corpus()
    model0 = init_model(cfg, 0)
    n_params = sum(x.size for x in jtu.tree_leaves(model0))
    print(
        f"data: {len(TRAIN_FILES)} stdlib files, {len(train_data):,} training bytes; "
        f"{len(VALID_FILES)} files, {len(valid_data):,} validation bytes"
    )
    print(
        f"model: {cfg.layers} layers, width {cfg.width}, {cfg.heads} heads, context "
        f"{cfg.context}, {n_params:,} params (float32); batch {cfg.batch} x "
        f"{cfg.context} bytes, {cfg.steps} steps, validation every {cfg.eval_every} "
        f"steps on {cfg.valid_batches * cfg.batch} windows\n"
    )
    offsets = train_offsets(cfg, len(train_data), 0)
    valid_offsets = jnp.asarray(
        np.linspace(0, len(valid_data) - cfg.context - 2, cfg.valid_batches * cfg.batch)
        .astype(np.int32)
        .reshape(cfg.valid_batches, cfg.batch)
    )
    train_dev, valid_dev = jnp.asarray(train_data), jnp.asarray(valid_data)

    @jax.jit
    def evaluate(model):
        losses = jax.lax.map(
            lambda o: batch_loss(model, valid_dev, o, cfg.context), valid_offsets
        )
        return losses.mean()

    if args.precision:
        return precision_main(args, cfg, info, train_data, train_dev, evaluate)

    # The sweep: one compiled step per optimizer, for every learning rate.
    results = []
    compiled = {}
    for name in names:
        compiled[name] = Compiled(name, cfg, model0, train_dev, offsets)
        lrs = OPTIMIZERS[name][0]
        if quick:
            lrs = lrs[1:2]
        for lr in lrs:
            run = train(cfg, name, lr, compiled[name], evaluate, model0, offsets)
            results.append(run)
            print(
                f"  {OPTIMIZERS[name][1]:8s} lr {lr:<7g} final validation loss "
                f"{C.fmt(run['final'], 4)}{' (diverged)' if run['diverged'] else ''}"
                f"  [{run['train_seconds']:.1f} s training; compile "
                f"{compiled[name].seconds:.1f} s]",
                flush=True,
            )
    print()
    print("Final validation loss per learning rate:\n")
    rows = []
    for name in names:
        runs = [r for r in results if r["optimizer"] == name]
        rows.append(
            [OPTIMIZERS[name][1]]
            + [f"{r['lr']:g}: {C.fmt(r['final'], 4)}" for r in runs]
        )
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    print(C.table(["optimizer"] + [f"lr {i + 1}" for i in range(width - 1)], rows))

    def final_key(r):
        return r["final"] if math.isfinite(r["final"]) else math.inf

    best = {
        name: min((r for r in results if r["optimizer"] == name), key=final_key)
        for name in names
    }
    target = best["adamw"]["final"]

    # Step time (interleaved) and state memory, at the best learning rates.
    runners = {}
    reports = {}
    feed = lambda a, out: (out[0], out[1], a[2])
    for name in names:
        opt = make_opt(name, best[name]["lr"], cfg, model0)
        model = C.fresh_copy(model0)
        reports[name] = eqxopt.verify(opt, model0)
        runners[name] = C.Runner(
            compiled[name].bind(opt), (model, opt.init(model), offsets[0]), feed
        )
    ref = optax_muon(best["muon"]["lr"] if "muon" in best else 0.02, model0)
    model = C.fresh_copy(model0)
    with STANDARD():
        ref_state = ref.init(model)
        ref_step = (
            jax.jit(
                train_step(ref.update, train_dev, cfg.context, STANDARD),
                donate_argnums=(0, 1),
            )
            .lower(model, ref_state, offsets[0])
            .compile()
        )
    runners["muon (optax)"] = C.Runner(ref_step, (model, ref_state, offsets[0]), feed)
    times = C.interleaved(runners, repeats, min_seconds=0.2 if not quick else 0.02)
    step_ms = {name: C.median(ts) * 1e3 for name, ts in times.items()}

    print("\nAt each optimizer's best learning rate:\n")
    rows = []
    summary = {}
    adamw_bytes = reports["adamw"].nbytes
    for name in names:
        run = best[name]
        reached = steps_to_reach(run["curve"], target)
        frac = reached / cfg.steps if reached is not None else math.nan
        summary[name] = {
            "lr": run["lr"],
            "final": run["final"],
            "steps_to_adamw": reached,
            "steps_to_adamw_fraction": frac,
            "step_ms": step_ms[name],
            "step_ratio": C.ratio(step_ms[name], step_ms["adamw"]),
            "state_bytes": reports[name].nbytes,
            "state_bytes_per_param": reports[name].nbytes / n_params,
            "state_ratio": C.ratio(reports[name].nbytes, adamw_bytes),
            "train_seconds": run["train_seconds"],
        }
        s = summary[name]
        rows.append(
            [
                OPTIMIZERS[name][1],
                f"{run['lr']:g}",
                C.fmt(run["final"], 4),
                "not reached" if reached is None else f"{reached} ({frac:.2f})",
                f"{step_ms[name]:.1f}",
                C.fmt(s["step_ratio"]),
                f"{s['state_bytes_per_param']:.2f}",
                C.fmt(s["state_ratio"]),
            ]
        )
    headers = [
        "optimizer",
        "best lr",
        "final valid loss",
        "steps to AdamW's loss (fraction)",
        "step ms",
        "step / AdamW",
        "state bytes / param",
        "state / AdamW",
    ]
    main_table = C.table(headers, rows)
    print(main_table)
    muon_ratio = C.ratio(step_ms.get("muon", math.nan), step_ms["muon (optax)"])
    muon_line = (
        f"Muon train step: eqxopt {step_ms.get('muon', math.nan):.1f} ms, Optax "
        f"{step_ms['muon (optax)']:.1f} ms (optax.contrib.muon, same routing): "
        f"ratio eqxopt / Optax {muon_ratio:.2f} (medians of {repeats} interleaved "
        f"rounds)"
    )
    print()
    print(muon_line)

    if args.plot:
        caption = (
            f"char-level LM on stdlib source: {cfg.layers} layers, width {cfg.width}, "
            f"{C.human(n_params)} params, batch {cfg.batch}x{cfg.context}; "
            f"{info['cpu']}, {info['cores']} cores"
        )
        path = args.plot_path or str(C.repo_root() / "docs/_static/bench_lm.png")
        plot(results, best, step_ms, path, caption)
        print(f"\nplot: {path}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": info,
                    "config": vars(cfg),
                    "n_params": n_params,
                    "runs": results,
                    "summary": summary,
                    "step_ms": step_ms,
                    "muon_eqxopt_over_optax": muon_ratio,
                },
                indent=1,
            )
        )
    if args.docs:
        text = (
            f"Measured with `python benchmarks/lm.py` on {info['cpu']} "
            f"({info['cores']} cores, {info['backend']}; jax {info['jax']}, optax "
            f"{info['optax']}): {cfg.layers} layers, width {cfg.width}, context "
            f"{cfg.context}, {n_params:,} float32 params; batch {cfg.batch} windows, "
            f"{cfg.steps} steps; validation loss in nats per byte.\n\n"
            + main_table
            + "\n\n"
            + muon_line
            + "."
        )
        C.write_docs_section(args.docs, "lm.py", text)


if __name__ == "__main__":
    main()
