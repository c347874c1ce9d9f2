"""Shared utilities of the benchmark scripts (not part of eqxopt).

The rules every script follows, so that numbers taken on a noisy shared machine mean
something:

- Compare in the same process and interleave: one repeat of A, one of B, one of A, ...
  (the order alternates every round), so that a burst of load from elsewhere hits both
  sides alike. Report medians of the repeats and ratios of medians.
- Time jitted steps with DONATED state (`donate_argnums`). Without donation every step
  allocates fresh output buffers, and at 10M parameters and above the time mostly
  measures page faults (ratios then swing 0.6-3x between identical programs).
- Compile ahead of time (`jax.jit(f, donate_argnums=...).lower(*args).compile()`): the
  same compiled object gives the trace and compile times, `memory_analysis()` (peak
  memory of the step) and the optimized HLO (to look for copies of param-sized
  buffers), and is then timed.

Import it from a script in this folder with `from _common import ...` (the folder is
on `sys.path` when a script runs); `repo_root()` is put on `sys.path` too, so that
`eqxopt` and `tests.helpers` import from a fresh clone without installing.
"""

import contextlib
import dataclasses
import datetime
import importlib.metadata
import math
import os
import platform
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np


def repo_root() -> Path:
    return ROOT


# --- machine and versions ---------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict[str, Any]:
    """Machine, backend and package versions, for the record."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count()
    devices = jax.devices()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"
        ),
        "cpu": _cpu_model(),
        "cores": cores,
        "memory_gb": _memory_gb(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "devices": f"{len(devices)} x {devices[0].device_kind}",
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "equinox": _version("equinox"),
        "optax": _version("optax"),
        "eqxopt": _version("eqxopt"),
        "numpy": np.__version__,
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "EQXOPT_CHECK_STATE": os.environ.get("EQXOPT_CHECK_STATE", "1 (default)"),
        "load_average": _loadavg(),
    }


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        return "n/a"


def machine_line(info: dict[str, Any]) -> str:
    return (
        f"{info['cpu']}, {info['cores']} cores, {info['memory_gb']} GB, "
        f"{info['backend']} ({info['devices']}); jax {info['jax']}, jaxlib "
        f"{info['jaxlib']}, equinox {info['equinox']}, optax {info['optax']}, "
        f"eqxopt {info['eqxopt']}, Python {info['python']}; {info['date']}; "
        f"load average at start {info['load_average']}"
    )


# --- statistics -------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if len(xs) else math.nan


def ratio(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return math.nan
    return a / b


# --- compiling and timing donated steps -----------------------------------------------


def abstract(tree):
    """`tree` with every array replaced by a `jax.ShapeDtypeStruct` (for lowering
    without allocating)."""
    return jtu.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if hasattr(x, "shape") else x,
        tree,
    )


@dataclasses.dataclass
class Compiled:
    """The result of [`compile_step`][]."""

    compiled: Any
    lower_seconds: float
    compile_seconds: float
    unusable_donations: int

    @property
    def seconds(self) -> float:
        """Trace (lowering included) plus compile time."""
        return self.lower_seconds + self.compile_seconds


def compile_step(
    fn: Callable, args: Sequence[Any], donate_argnums: Sequence[int], context=None
) -> Compiled:
    """`jax.jit(fn, donate_argnums=...).lower(*args).compile()`, timed.

    Pass a FRESH `fn` (a new closure) to measure a cold trace: JAX caches traces per
    function object. `args` may hold arrays or `jax.ShapeDtypeStruct`s. `context` is
    entered around tracing and compiling (e.g. `jax.numpy_dtype_promotion("standard")`
    for Optax). Donation warnings ("Some donated buffers were not usable") are
    counted, not shown: a state buffer that cannot be donated is a finding.
    """
    jitted = jax.jit(fn, donate_argnums=tuple(donate_argnums))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with context if context is not None else contextlib.nullcontext():
            t0 = time.perf_counter()
            lowered = jitted.lower(*args)
            t1 = time.perf_counter()
            compiled = lowered.compile()
            t2 = time.perf_counter()
    unusable = 0
    for w in caught:
        message = str(w.message)
        if "donated buffers were not usable" in message:
            unusable += message.count("ShapedArray") or 1
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return Compiled(compiled, t1 - t0, t2 - t1, unusable)


class Runner:
    """A compiled step and its current arguments.

    `step(*args) -> outputs`; `feed(args, outputs) -> args` builds the next call's
    arguments (donated ones replaced by the outputs that alias them). `run(n)` makes
    `n` calls and returns the seconds per call (blocking on the last outputs).
    """

    def __init__(self, step: Callable, args: Sequence[Any], feed: Callable):
        self.step = step
        self.args = tuple(args)
        self.feed = feed

    def run(self, n: int) -> float:
        args = self.args
        t0 = time.perf_counter()
        for _ in range(n):
            out = self.step(*args)
            args = self.feed(args, out)
        jax.block_until_ready(args)
        seconds = (time.perf_counter() - t0) / n
        self.args = args
        return seconds


def interleaved(
    runners: dict[str, Runner],
    repeats: int,
    min_seconds: float = 0.02,
    max_inner: int = 200,
    warmup: int = 2,
) -> dict[str, list[float]]:
    """Time `runners` in alternating rounds: each round times one repeat of every
    runner, in an order that reverses every round. A repeat makes enough calls to last
    about `min_seconds` (at most `max_inner`), chosen per runner after `warmup` calls.
    Returns the seconds per call of every repeat, per runner."""
    inner = {}
    for name, runner in runners.items():
        t = min(runner.run(1) for _ in range(max(warmup, 1)))
        inner[name] = int(min(max_inner, max(1, math.ceil(min_seconds / max(t, 1e-9)))))
    names = list(runners)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(runners[name].run(inner[name]))
    return times


# --- compiled-program inspection ----------------------------------------------------


def memory(compiled) -> dict[str, int] | None:
    """Bytes of the compiled step's arguments, outputs, aliased (donated) outputs and
    temporaries, and the peak `argument + output - alias + temp`."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # pragma: no cover - backend without memory analysis
        return None
    if stats is None:  # pragma: no cover
        return None
    out = {
        "argument": int(stats.argument_size_in_bytes),
        "output": int(stats.output_size_in_bytes),
        "alias": int(stats.alias_size_in_bytes),
        "temp": int(stats.temp_size_in_bytes),
    }
    out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    return out


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*([a-z0-9]+)\[([0-9,]*)\]\S*\s+"
    r"(copy|copy-start)\("
)
_CALLS = re.compile(r"calls=%?([\w.\-]+)")


def param_sized_copies(
    hlo_text: str, shapes: Sequence[tuple[int, ...]], min_elements: int = 4096
) -> list[str]:
    """Copies of param-sized buffers in an optimized HLO module (`compiled.as_text()`).

    Looks at every `copy`/`copy-start` instruction outside fusion bodies (inside a
    fusion a copy is a register move, not a buffer) whose result has the shape of one
    of `shapes` (the param leaves) and at least `min_elements` elements. Returns the
    offending instructions as `name: dtype[shape]`.
    """
    fusion_bodies = set()
    for line in hlo_text.splitlines():
        if " fusion(" in line:
            fusion_bodies.update(_CALLS.findall(line))
    wanted = {tuple(s) for s in shapes if math.prod(s) >= min_elements}
    found = []
    current = None
    for line in hlo_text.splitlines():
        m = _COMPUTATION.match(line)
        if m and not line.startswith(" "):
            current = m.group(1)
            continue
        if current in fusion_bodies:
            continue
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        name, dtype, dims, _ = m.groups()
        shape = tuple(int(d) for d in dims.split(",") if d)
        if shape in wanted:
            found.append(f"{name}: {dtype}[{','.join(map(str, shape))}]")
    return found


# --- parameter trees -----------------------------------------------------------------


def transformer_shapes(n_params: int, n_layers: int = 5) -> dict[str, tuple[int, ...]]:
    """Leaf shapes of a transformer-like model with about `n_params` parameters and
    `3 + 12 * n_layers` leaves (63 by default), in Equinox's `(out, in)` layout:
    an embedding `(4d, d)`, per layer two layer norms, `qkv (3d, d)`, `out (d, d)`,
    `up (4d, d)`, `down (d, 4d)` with their biases, and a final layer norm. The width
    `d` is a multiple of 8."""
    # total = (12 L + 4) d^2 + (13 L + 2) d
    a, b = 12 * n_layers + 4, 13 * n_layers + 2
    d = (-b + math.sqrt(b * b + 4 * a * n_params)) / (2 * a)
    d = max(8, int(round(d / 8)) * 8)
    shapes = {"embed": (4 * d, d)}
    for i in range(n_layers):
        layer = {
            "ln1.scale": (d,),
            "ln1.bias": (d,),
            "attn.qkv.weight": (3 * d, d),
            "attn.qkv.bias": (3 * d,),
            "attn.out.weight": (d, d),
            "attn.out.bias": (d,),
            "ln2.scale": (d,),
            "ln2.bias": (d,),
            "mlp.up.weight": (4 * d, d),
            "mlp.up.bias": (4 * d,),
            "mlp.down.weight": (d, 4 * d),
            "mlp.down.bias": (d,),
        }
        shapes.update({f"layer{i}.{k}": v for k, v in layer.items()})
    shapes["ln_f.scale"] = (d,)
    shapes["ln_f.bias"] = (d,)
    return shapes


def count(shapes: dict[str, tuple[int, ...]]) -> int:
    return sum(math.prod(s) for s in shapes.values())


def human(n: float) -> str:
    """`1.06M`, `9.9M`, `512K`."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.3g}{unit}"
    return str(int(n))


def random_array(seed: int, shape, dtype=jnp.float32, scale: float = 1.0):
    """Normal entries of standard deviation `scale`, drawn by NumPy on the host:
    `jax.random` (or any eager JAX op) would compile one program per shape, and a
    transformer's tree has dozens."""
    x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    return jnp.asarray(x * np.float32(scale) if scale != 1.0 else x, dtype=dtype)


def params_and_grads(shapes: dict[str, tuple[int, ...]]):
    """Random float32 params (each matrix scaled by 1/sqrt(fan-in)) and grads of these
    shapes."""
    params = {
        k: random_array(i, s, scale=s[-1] ** -0.5)
        for i, (k, s) in enumerate(shapes.items())
    }
    grads = {
        k: random_array(len(shapes) + i, s) for i, (k, s) in enumerate(shapes.items())
    }
    return params, grads


def fresh_copy(tree):
    """A copy of every array of `tree` in new buffers (each donating runner needs its
    own params and state)."""
    return jtu.tree_map(lambda x: jnp.array(x, copy=True), tree)


# --- output ---------------------------------------------------------------------


def fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return f"{x:.{digits}f}"
    return str(x)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (readable as plain text too)."""
    cells = [[str(h) for h in headers]] + [[fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def write_docs_section(path: str | Path, name: str, text: str) -> None:
    """Replace the text between `<!-- {name}:begin -->` and `<!-- {name}:end -->` in
    the Markdown file `path` (both markers must be there)."""
    path = Path(path)
    doc = path.read_text()
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in doc or end not in doc:
        raise ValueError(f"{path} has no `{begin}` ... `{end}` section.")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(head + begin + "\n" + text.strip() + "\n" + end + tail)
