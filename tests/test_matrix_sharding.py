"""The matrix optimizers spread their per-matrix work (eigh and QR, inverse roots,
PSGD factor updates, Newton-Schulz) over the devices of a mesh: with params sharded
over 8 devices, each device's compiled program does about 1/8 of the single-device
program's matrix work, and the results equal the single-device ones."""

import re

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import eqxopt

from .test_sharding import _mesh, FAST_COMPILE, N


LEAVES = 8
SIZE = 16

# Each optimizer configured so that one `update` runs its expensive per-matrix work.
OPTIMIZERS = {
    "SOAP": lambda **kw: eqxopt.SOAP(1e-2, precondition_frequency=1, **kw),
    # (One root per leaf, without the power iteration: a smaller program to compile.)
    "Shampoo": lambda **kw: eqxopt.Shampoo(
        1e-2,
        block_size=SIZE,
        start_preconditioning_step=1,
        preconditioner_type="input",
        relative_matrix_epsilon=False,
        best_effort_shape_interpretation=False,
        **kw,
    ),
    "Kron": lambda **kw: eqxopt.Kron(
        1e-2, preconditioner_update_probability=1.0, key=1, **kw
    ),
    "Muon": lambda **kw: eqxopt.Muon(2e-2, **kw),
    "NorMuon": lambda **kw: eqxopt.NorMuon(2e-2, **kw),
}


def _tree(key, leaves=LEAVES, size=SIZE):
    keys = jr.split(key, leaves)
    return {
        f"w{i}": jr.normal(k, (size, size), jnp.float64) for i, k in enumerate(keys)
    }


# --- the matrix work in a compiled (per-device) program -------------------------------

_DEF = re.compile(r"^\s*(?:ROOT\s+)?(%[\w.\-]+) = \(?\w+\[([\d,]*)\]")
_OP = re.compile(r"\s(dot|custom-call|triangular-solve)\((%[\w.\-]+)")
_LAPACK = re.compile(r'custom_call_target="[^"]*(syevd|heevd|geqrf|orgqr|ungqr|trsm)')
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED = re.compile(
    r"(?:condition|body|to_apply|calls|true_computation|false_computation"
    r"|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)"
)


def _called(line: str) -> list[str]:
    """The computations an HLO instruction's line calls (a loop's condition and body,
    a fusion's, a conditional's branches, a reduction's)."""
    return [
        name.strip().lstrip("%")
        for m in _CALLED.finditer(line)
        for name in m.group(1).strip("{}").split(",")
    ]


_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def computations(hlo: str) -> tuple[dict[str, list[str]], str]:
    """The computations of an HLO module's text (name -> its instructions' lines) and
    the name of its entry computation."""
    found: dict[str, list[str]] = {}
    current, entry = None, ""
    for line in hlo.splitlines():
        m = _COMPUTATION.match(line)
        if m is not None and not line.startswith(" "):
            current = found.setdefault(m.group(1), [])
            entry = m.group(1) if line.startswith("ENTRY") else entry
        elif current is not None and line.startswith(" "):
            current.append(line)
    return found, entry


def runs(hlo: str) -> dict[str, int]:
    """How many times each computation of a compiled HLO module runs per call of its
    entry: a `while` loop's condition and body run its known trip count times (a
    `lax.scan` or `lax.map`), once if it has none (a data-dependent loop); every
    other called computation (fusions, branches) once per run of its caller."""
    comps, entry = computations(hlo)
    count = dict.fromkeys(comps, 0)

    def visit(name, times):
        if name not in comps:
            return
        count[name] += times
        for line in comps[name]:
            trip = _TRIP_COUNT.search(line) if re.search(r"\swhile\(", line) else None
            for called in _called(line):
                n = int(trip.group(1)) if trip is not None else 1
                visit(called, times * n)

    visit(entry, 1)
    return count


def instruction_shapes(hlo: str) -> dict[str, tuple[int, ...]]:
    """The shape of every instruction of an HLO module's text (the first element's,
    for a tuple), by name."""
    shapes = {}
    for line in hlo.splitlines():
        m = _DEF.match(line)
        if m is not None:
            shapes[m.group(1)] = tuple(int(d) for d in m.group(2).split(",") if d)
    return shapes


def matrix_work(hlo: str) -> float:
    """The matrix work of a compiled HLO module, per device: for each `dot`, twice the
    output size times the contracted size (its FLOPs); for each eigh, QR or
    triangular solve (custom calls into LAPACK, or `triangular-solve`), `b * n**3` for
    a `(b, ..., n, n)` first operand; each times the number of times its computation
    runs (see `runs`: the iterations of a `lax.map` over a stack count, those of a
    data-dependent loop count once, as the programs compared run the same ones)."""
    shapes = instruction_shapes(hlo)
    comps, _ = computations(hlo)
    total = 0.0
    for name, times in runs(hlo).items():
        for line in comps[name]:
            m, op = _DEF.match(line), _OP.search(line)
            if m is None or op is None:
                continue
            out, first = shapes[m.group(1)], shapes[op.group(2)]
            if op.group(1) == "dot":
                c = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line)
                contracted = [int(d) for d in c.group(1).split(",") if d] if c else []
                k = int(np.prod([first[d] for d in contracted]))
                total += times * 2.0 * float(np.prod(out)) * k
            elif op.group(1) == "triangular-solve" or _LAPACK.search(line):
                total += times * float(np.prod(first[:-2])) * first[-1] ** 3
    return total


def _steps(opt):
    """`STEPS` updates from `opt.init`, as one `lax.scan` (one copy of `update` in the
    compiled program)."""

    def run(params, grads):
        def step(carry, g):
            params, state = carry
            params, state = opt.step(params, g, state)
            return (params, state), None

        (params, state), _ = jax.lax.scan(step, (params, opt.init(params)), grads)
        return params, state

    return run


STEPS = 3


def _compile(opt, params, grads):
    compiled = jax.jit(_steps(opt), compiler_options=FAST_COMPILE)
    compiled = compiled.lower(params, grads).compile()
    return compiled, matrix_work(str(compiled.as_text()))


def test_matrix_work_counts_each_run_of_a_dot():
    """`matrix_work` on a compiled program of known work (each `4x4 @ 4x4` is 128
    FLOPs): a dot in a loop of known trip count counts every iteration, one in a
    branch or a data-dependent loop once, one in a fusion like any other."""

    def f(x):
        y = jax.lax.fori_loop(0, 3, lambda i, y: jnp.tanh(y @ y), x)
        y = jax.lax.cond(y[0, 0] > 0, lambda y: y @ x, lambda y: -y, y)
        return jax.lax.while_loop(lambda y: y[0, 0] < 10, lambda y: y @ x + 1, y)

    compiled = jax.jit(f, compiler_options=FAST_COMPILE).lower(jnp.eye(4)).compile()
    assert matrix_work(str(compiled.as_text())) == 5 * 128


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_each_device_does_an_eighth_of_the_matrix_work(name, getkey):
    params = _tree(getkey())
    grads = jax.tree.map(
        lambda *xs: jnp.stack(xs), *[_tree(getkey()) for _ in range(STEPS)]
    )
    single, single_work = _compile(OPTIMIZERS[name](), params, grads)
    mesh = _mesh()
    params_s = jax.device_put(params, NamedSharding(mesh, P("x")))
    grads_s = jax.device_put(grads, NamedSharding(mesh, P(None, "x")))
    spread, spread_work = _compile(OPTIMIZERS[name](), params_s, grads_s)
    # 8 same-shape leaves over 8 devices: one leaf's matrices per device. What is not
    # spread (statistics and preconditioning matmuls on the leaves) is split by XLA
    # along the leaves' sharded rows, so the whole is 1/8 of the single-device work.
    assert single_work > 0
    assert spread_work <= 1.05 * single_work / N, (spread_work, single_work)

    # The results are the single-device ones.
    expected, got = single(params, grads), spread(params_s, grads_s)
    assert got[0]["w0"].sharding.spec == P("x")
    flat_e = jax.tree_util.tree_leaves_with_path(expected)
    flat_g = jax.tree_util.tree_leaves(got)
    assert len(flat_e) == len(flat_g)
    for (path, a), b in zip(flat_e, flat_g):
        # float64 (the suite runs with x64), to 1e-9 of each leaf's largest entry: the
        # sharded program sums the statistics' contractions in another order
        # (per-device partial sums, then an all-reduce), and the roots and the
        # eigenvectors of close eigenvalues amplify that rounding (~1e-16) by their
        # condition numbers; in float32 SOAP's second moment differs by ~3e-4
        # relative from that alone.
        a, b = np.asarray(a), np.asarray(b)
        scale = max(1.0, float(np.max(np.abs(a)))) if a.size else 1.0
        np.testing.assert_allclose(
            b, a, rtol=0, atol=1e-9 * scale, err_msg=jax.tree_util.keystr(path)
        )


@pytest.mark.parametrize(
    "name, spread",
    [(name, True) for name in OPTIMIZERS] + [("SOAP", False)],
)
def test_explicit_mesh_spreads_and_matches(name, spread, getkey):
    """With sharding in types (`Explicit` axes) the stacks are spread under
    `jax.sharding.auto_axes`; the state keeps the shardings `state_shardings`
    predicts, and two steps equal the single-device ones: SOAP's second step
    refreshes its bases (reordering its second moment along a sharded axis and
    rotating its momentum), Shampoo's second is preconditioned (its grafting selects
    between the preconditioned and the grafting direction). With `spread=False`
    SOAP rotates its gathered momentum on every device."""
    params = _tree(getkey(), leaves=3)
    grads = [_tree(getkey(), leaves=3) for _ in range(2)]
    opt = OPTIMIZERS[name](spread=spread)
    ref = (None, opt.init(params))
    single = jax.jit(opt.update, compiler_options=FAST_COMPILE)
    for g in grads:
        ref = single(g, ref[1], params)
    mesh = _mesh(AxisType.Explicit)
    with jax.set_mesh(mesh):
        params, grads = jax.device_put((params, grads), P("x"))
        predicted = eqxopt.state_shardings(opt, params)
        new_state = jax.jit(opt.init)(params)
        update = jax.jit(opt.update, compiler_options=FAST_COMPILE)
        updates = None
        for g in grads:
            updates, new_state = update(g, new_state, params)
        assert updates is not None
    for path, leaf, sharding in zip(
        *zip(*jax.tree_util.tree_leaves_with_path(new_state)),
        jax.tree.leaves(predicted),
    ):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), (
            jax.tree_util.keystr(path)
        )
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(ref),
        jax.tree.leaves((updates, new_state)),
    ):
        # float64; as above, to 1e-9 of each leaf's largest entry.
        a, b = np.asarray(a), np.asarray(b)
        scale = max(1.0, float(np.max(np.abs(a)))) if a.size else 1.0
        np.testing.assert_allclose(
            b, a, rtol=0, atol=1e-9 * scale, err_msg=jax.tree_util.keystr(path)
        )


@pytest.mark.parametrize("name", ["NorMuon"])
def test_state_shardings_after_update(name, getkey):
    """Under `jit` with `Auto` axes, the updated state has the shardings
    `state_shardings` predicts (the row moments and factor matrices replicated,
    buffers that mirror a param sharded like it), so a training step's state keeps
    its types; the updates are sharded like the params, not replicated by the
    gather of the spread work. (NorMuon compiles fastest; the others constrain their
    factors with the same `_matrix.replicate`.)"""
    mesh = _mesh()
    params = jax.device_put(_tree(getkey()), NamedSharding(mesh, P("x")))
    opt = OPTIMIZERS[name]()
    predicted = eqxopt.state_shardings(opt, params)
    state = jax.jit(opt.init, out_shardings=predicted)(params)
    update = jax.jit(opt.update, compiler_options=FAST_COMPILE)
    updates, new_state = update(params, state, params)
    for (path, u), p in zip(
        jax.tree_util.tree_leaves_with_path(updates), jax.tree.leaves(params)
    ):
        assert u.sharding.is_equivalent_to(p.sharding, u.ndim), (
            jax.tree_util.keystr(path),
            u.sharding,
        )
    for (path, leaf), sharding in zip(
        jax.tree_util.tree_leaves_with_path(new_state), jax.tree.leaves(predicted)
    ):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), (
            jax.tree_util.keystr(path),
            leaf.sharding,
            sharding,
        )


def test_spread_map_pads_and_groups(getkey):
    """Mixed shapes and counts that do not divide the mesh: each group is padded to a
    multiple of 8 and split, so each device runs one eigh per group (on CPU an
    unbatched one, see `test_stacks_issue_no_batched_lapack_call_on_cpu`), and every
    result is the unspread one."""
    from eqxopt._matrix.linalg import eigh_basis
    from eqxopt._matrix.spread import find_spread, spread_map

    def sym(key, n):
        a = jr.normal(key, (n, n), jnp.float64)
        return a @ a.T

    mats = [sym(getkey(), 6) for _ in range(5)] + [sym(getkey(), 4) for _ in range(3)]
    fn = lambda _, shared, m: eigh_basis(m) * shared
    expected = [fn(None, 2.0, m) for m in mats]
    mesh = _mesh()
    replicated = jax.device_put(mats, NamedSharding(mesh, P()))

    def run(mats):
        spread = find_spread(True, mats, "test")
        assert spread is not None and spread.axes == ("x",) and spread.size == N
        return spread_map(fn, [(None, (m,)) for m in mats], spread, shared=2.0)

    compiled = jax.jit(run).lower(replicated).compile()
    eighs = re.findall(
        r"= \(f64\[([\d,]*)\].*custom_call_target=\"lapack_dsyevd",
        str(compiled.as_text()),
    )
    assert sorted(eighs) == (
        ["4,4", "6,6"] if jax.default_backend() == "cpu" else ["1,4,4", "1,6,6"]
    )
    for a, b in zip(expected, compiled(replicated)):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_spread_map_cheap_runs_tasks_alone_on_cpu(getkey):
    """`cheap=True` without a spread: on CPU each task is computed alone (no stack,
    so no `lax.map` loop), elsewhere stacked as before; the results are each task's
    own either way, and the same as stacked."""
    from eqxopt._matrix.spread import spread_map

    mats = [jr.normal(getkey(), (5, 3)) for _ in range(3)] + [jr.normal(getkey(), (4,))]
    fn = lambda _, shared, m: jnp.tanh(m) * shared + jnp.sum(m * m)
    tasks = [(None, (m,)) for m in mats]
    run = lambda cheap: jax.jit(
        lambda tasks: spread_map(fn, tasks, None, shared=2.0, cheap=cheap)
    )
    if jax.default_backend() == "cpu":
        hlo = lambda cheap: str(run(cheap).lower(tasks).compile().as_text())
        assert " while(" not in hlo(True) and " while(" in hlo(False)
    expected = [fn(None, 2.0, m) for m in mats]
    for cheap in (True, False):
        for a, b in zip(expected, run(cheap)(tasks)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6)
    for a, b in zip(run(False)(tasks), run(True)(tasks)):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_stacked_results_are_sliced_by_one_kernel(getkey):
    """The results of a stack of tasks are sliced out at offsets XLA cannot fold, so
    every slice of a stack compiles into the same kernel (a slice at a constant offset
    would be a kernel of its own for each task); each task still gets its own
    results, also when a task's values are NaN."""
    from eqxopt._matrix.spread import spread_map

    mats = [jr.normal(getkey(), (6, 6)) for _ in range(5)]
    mats[0] = mats[0].at[0, 0].set(jnp.nan)  # the value the offsets are keyed on
    fn = lambda _, shared, m: m @ m.T * shared
    tasks = [(None, (m,)) for m in mats]
    run = jax.jit(lambda tasks: spread_map(fn, tasks, None, shared=2.0))
    for got, m in zip(run(tasks), mats, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(fn(None, 2.0, m)))
    # The fusions of the program's entry (after the loop over the stack) that take
    # the (5, 6, 6) stack of results and give one (6, 6) task.
    hlo = str(run.lower(tasks).compile().as_text())
    bodies = {}
    for computation in re.split(r"\n(?=\S)", hlo):
        head, _, body = computation.partition("\n")
        bodies[head.split(" ", 1)[0].lstrip("%")] = body
    entry = bodies["ENTRY"]
    calls = re.findall(
        r"= f(?:32|64)\[6,6\]\S* fusion\([^)]*\).*?calls=%?([\w.\-]+)", entry
    )
    slices = {
        re.sub(r"%[\w.\-]+|, metadata=\{[^}]*\}", "", bodies[c])
        for c in calls
        if re.search(r"f(?:32|64)\[5,6,6\]\S* parameter", bodies[c])
    }
    assert len(calls) == len(mats) and len(slices) == 1, slices


def lapack_calls(hlo: str) -> list[tuple[str, tuple[int, ...]]]:
    """The LAPACK custom calls (eigh, QR, triangular solve) of a compiled HLO module:
    (routine, shape of the first operand) of each."""
    shapes = instruction_shapes(hlo)
    calls = []
    for line in hlo.splitlines():
        op, routine = _OP.search(line), _LAPACK.search(line)
        if op is not None and routine is not None:
            calls.append((routine.group(1), shapes[op.group(2)]))
    return calls


@pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="accelerators vmap the stacks"
)
@pytest.mark.parametrize("spread", [False, True])
def test_stacks_issue_no_batched_lapack_call_on_cpu(spread, getkey):
    """SOAP's eigh and QR take one matrix per LAPACK call on CPU (8 leaves of 16x16
    and 8 of 8x8, two factors each). With a spread, same-shape matrices are stacked
    and each device's share mapped by a loop: one call per routine and matrix size in
    the program. Without one, each matrix has its own call, which compiles faster
    than a loop over a stack (see `eqxopt._matrix.spread.spread_map`). Never a batched
    call: that schedules its matrices on XLA's intra-op thread pool and blocks its
    thread until they are done, which deadlocked a run of `benchmarks/lm.py` (see
    `eqxopt._matrix.spread.batched_kernels`)."""
    params = {
        **_tree(getkey()),
        **{f"v{i}": w for i, w in enumerate(jax.tree.leaves(_tree(getkey(), size=8)))},
    }
    if spread:
        params = jax.device_put(params, NamedSharding(_mesh(), P()))
    opt = OPTIMIZERS["SOAP"]()
    update = jax.jit(opt.update, compiler_options=FAST_COMPILE)
    hlo = str(update.lower(params, opt.init(params), params).compile().as_text())
    calls = lapack_calls(hlo)
    # SOAP's update holds both of its refreshes of the bases: by an eigh (`syevd`,
    # the first) and by a power iteration and a QR (`geqrf`, then `orgqr` to form Q).
    copies = 1 if spread else 2 * LEAVES
    assert sorted(calls) == sorted(
        (routine, (n, n))
        for routine in ("geqrf", "orgqr", "syevd")
        for n in (8, 16)
        for _ in range(copies)
    ), calls


@pytest.mark.parametrize("backend", ["gpu", "tpu"])
def test_soap_decompositions_loop_on_gpus(backend, monkeypatch, getkey):
    """On a GPU, where other stacks are `vmap`-ed, SOAP's eigh and QR still take one
    matrix per call: the batched QR of GPUs' solver library was 12x slower
    per matrix than a loop at 392x392 (see `eqxopt._matrix.spread.batched_kernels`).
    On a TPU they stay batched. The backend is simulated (only which kernels are called
    is checked, on this CPU)."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    params = {
        **_tree(getkey()),
        **{f"v{i}": w for i, w in enumerate(jax.tree.leaves(_tree(getkey(), size=8)))},
    }
    opt = OPTIMIZERS["SOAP"]()
    update = jax.jit(opt.update, compiler_options=FAST_COMPILE)
    hlo = str(update.lower(params, opt.init(params), params).compile().as_text())
    # 8 leaves of each size, two factors each: 16 matrices per size, in one batched
    # call on a TPU, in a call each on a GPU.
    batch, copies = ((), 2 * LEAVES) if backend == "gpu" else ((2 * LEAVES,), 1)
    assert sorted(lapack_calls(hlo)) == sorted(
        (routine, batch + (n, n))
        for routine in ("geqrf", "orgqr", "syevd")
        for n in (8, 16)
        for _ in range(copies)
    )


def test_spread_option():
    """`spread` is True, False, a mesh axis name or a tuple of names; an axis the
    params' mesh lacks is an error at trace time; `spread=False` repeats the work on
    every device."""
    for bad in (None, 1, (), ("x", "x"), ("x", 2)):
        for make in OPTIMIZERS.values():
            with pytest.raises(ValueError, match="spread"):
                make(spread=bad)
    listed = eqxopt.Muon(0.1, spread=["x"])  # pyright: ignore[reportArgumentType]
    assert listed.spread == ("x",)
    mesh = _mesh()
    w = {"w": jax.device_put(jnp.ones((16, 16)), NamedSharding(mesh, P("x")))}
    opt = eqxopt.Muon(0.1, spread="y")
    with pytest.raises(ValueError, match="'y' is not"):
        jax.jit(opt.update)(w, opt.init(w), w)


# --- no collective inside a data-dependent loop ---------------------------------------

_COLLECTIVE = re.compile(
    r"\s(all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter)"
    r"(-start)?\("
)


def loops_with_collectives(hlo: str) -> tuple[int, list[str]]:
    """The number of `while` loops of a compiled HLO module, and the collectives run
    inside any of them (in its condition, its body, or a computation they call)."""
    comps, _ = computations(hlo)

    def collectives(name, seen):
        if name in seen or name not in comps:
            return []
        seen.add(name)
        found = []
        for line in comps[name]:
            if _COLLECTIVE.search(line):
                found.append(line.strip())
            for called in _called(line):
                found += collectives(called, seen)
        return found

    loops, inside = 0, []
    for lines in comps.values():
        for line in lines:
            if re.search(r"\swhile\(", line):
                loops += 1
                for key in ("condition", "body"):
                    name = re.search(key + r"=%?([\w.\-]+)", line).group(1)  # pyright: ignore
                    inside += collectives(name, set())
    return loops, inside


def test_spread_loops_hold_no_collectives(getkey):
    """Shampoo's inverse roots, spread over the mesh, are batched `while_loop`s that
    run until every matrix of the batch has converged. Each device runs the loops on
    its own share, with a local predicate: no collective inside a loop. (Split by
    sharding constraints instead, XLA's partitioner all-reduced the predicate at
    every iteration of every loop, across all devices and processes.) The roots are
    the unspread ones."""
    from eqxopt._matrix.linalg import matrix_inverse_pth_root
    from eqxopt._matrix.spread import find_spread, spread_map

    def sym(key, n):
        a = jr.normal(key, (n, n), jnp.float64)
        return a @ a.T

    mats = [sym(getkey(), 4) for _ in range(5)]
    fn = lambda p, shared, m: matrix_inverse_pth_root(m, p, ridge_epsilon=shared)[0]
    expected = [fn(4, 1e-3, m) for m in mats]
    mesh = _mesh()

    def run(mats):
        spread = find_spread(True, mats, "test")
        assert spread is not None and spread.size == N
        return spread_map(fn, [(4, (m,)) for m in mats], spread, shared=1e-3)

    compiled = (
        jax.jit(run).lower(jax.device_put(mats, NamedSharding(mesh, P()))).compile()
    )
    loops, inside = loops_with_collectives(str(compiled.as_text()))
    # The power iteration for lambda_max and the Newton iteration.
    assert loops >= 2
    assert inside == []
    for a, b in zip(expected, compiled(mats)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-12)
