"""Multi-process training with JAX's own distributed runtime, on this machine.

Two processes with 4 CPU devices each (`jax.distributed.initialize` with a localhost
coordinator, Gloo collectives) train an Equinox MLP with FSDP-style sharded params on
one 8-device mesh; see tests/_multiprocess_worker.py for what each process does. This
module starts the processes, bounds their time, and compares what they wrote:

- 2 processes == 1 process with 8 devices, for every optimizer, params and state;
- an Orbax checkpoint written by both processes restores exactly, (a) in 2 processes
  onto the same mesh, where training then continues bit-for-bit, and (b) in 1 process
  onto another mesh (4 devices), where training continues to match.
"""

import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from .helpers import subprocess_env


ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "_multiprocess_worker.py"
# Every optimizer, trained by the same three processes (the 2 training processes, then
# the reference): what every training loop uses, then the matrix preconditioners.
# One set of processes, not one per group of optimizers: each process imports JAX,
# eqxopt and Orbax and traces every `jax.numpy` signature once (in three groups the
# processes took 84 CPU-s, in one 62).
OPTIMIZERS = (
    "AdamW",
    "ZeRO",  # AdamW with the model replicated and its state split over the mesh
    "Muon",
    "MultiSteps",
    "SOAP",
    "Shampoo",
    "Kron",
    "NorMuon",
)
# SOAP's eigenbases turn rounding differences in its statistics into differences in
# its directions, larger by the inverse gaps between their eigenvalues: measured
# 2.5e-4 of a leaf's largest entry after 6 steps (the same in two runs), against at
# most 9.4e-7 for the others. A wrong basis (as with rank-deficient statistics, see
# the worker) parts the runs by 10%.
RELATIVE_TOLERANCE = {"SOAP": 1e-3}
# Seconds for each set of processes (both sets together take about 40 s on 2 idle
# cores); generous because CI machines are shared and a compile-heavy process can be
# starved for minutes.
TIMEOUT = 480


class ProcessFailed(AssertionError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict[str, str]:
    env = subprocess_env(devices)
    # XLA's CPU client runs a process's devices on one thread pool of max(cores,
    # local devices) threads (`NPROC` overrides the core count), and a device that
    # waits in a cross-process collective keeps its thread. With 4 devices per
    # process on 2 cores, that pool was too small: training hung in 3 of 10 runs of
    # the SOAP+Shampoo group, 0 of 13 with 16 threads (8 of them with Shampoo's
    # default `spread`, which had hung in 2 of 6 runs). What hung: the two processes
    # started independent collectives in different orders, and XLA's Gloo
    # collectives all use one tag (see "Why those runs hung" in docs/scaling.md).
    env["NPROC"] = "16"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return env


def run_processes(commands, env, logs: pathlib.Path, timeout: float = TIMEOUT):
    """Start every command at once; wait until all have succeeded. As soon as one
    fails (or time runs out), end the others and raise `ProcessFailed` with the failed
    process's stderr."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for i, command in enumerate(commands):
            out = open(logs / f"{i}.out", "w")
            err = open(logs / f"{i}.err", "w")
            procs.append(
                (
                    subprocess.Popen(
                        command, cwd=ROOT, env=env, stdout=out, stderr=err
                    ),
                    out,
                    err,
                )
            )
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p, _, _ in procs]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i = failed[0]
                raise ProcessFailed(
                    f"process {i} of {len(procs)} exited with code {codes[i]}; its "
                    f"stderr:\n{_tail(logs / f'{i}.err')}"
                )
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                stderrs = "\n".join(
                    f"--- process {i} stderr:\n{_tail(logs / f'{i}.err')}"
                    for i in range(len(procs))
                )
                raise ProcessFailed(f"timed out after {timeout} s\n{stderrs}")
            time.sleep(0.1)
    finally:
        for p, out, err in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            out.close()
            err.close()


def _tail(path: pathlib.Path, chars: int = 6000) -> str:
    return path.read_text(errors="replace")[-chars:]


def _worker(*args) -> list[str]:
    # A process still running shortly before the deadline prints its Python stack to
    # its stderr (which is reported) and exits.
    extra = ["--dump-after", TIMEOUT - 5]
    return [sys.executable, str(WORKER), *map(str, args), *map(str, extra)]


def _stage(arrays, name, stage):
    prefix = f"{name}/{stage}"
    out = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
    # Keys look like "AdamW/straight[1].mu.layers[0].weight": the next character
    # after the stage starts a path. Returned keys: "AdamW: [1].mu.layers[0].weight".
    return {f"{name}: {k}": v for k, v in out.items() if k[:1] in ("[", ".")}


def _assert_identical(got, want):
    assert got.keys() == want.keys()
    assert len(want) > 0
    for path in want:
        assert got[path].dtype == want[path].dtype, path
        assert got[path].shape == want[path].shape, path
        np.testing.assert_array_equal(got[path], want[path], err_msg=path, strict=True)


def _assert_close(got, want, rtol=1e-5):
    """Equal up to float32 rounding. Gloo's cross-process all-reduce adds the 8
    devices' partial gradients in another order than one process's all-reduce (or
    than a 4-device mesh), so the runs differ by a few float32 ulps per step: measured
    at most 5e-7 of each leaf's largest entry after 6 steps. 1e-5 leaves a 20x margin
    and still catches any real difference (a skipped or repeated step, a wrong shard).
    """
    assert got.keys() == want.keys()
    assert len(want) > 0
    for path in want:
        g, w = got[path], want[path]
        assert g.dtype == w.dtype and g.shape == w.shape, path
        if np.issubdtype(w.dtype, np.inexact):
            scale = max(float(np.max(np.abs(w), initial=0.0)), 1e-30)
            diff = float(np.max(np.abs(g - w), initial=0.0))
            assert diff <= rtol * scale, path
        else:  # counters and flags
            np.testing.assert_array_equal(g, w, err_msg=path, strict=True)


@pytest.mark.slow
def test_two_processes_train_and_checkpoint_like_one(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    which = ("--optimizers", ",".join(OPTIMIZERS))
    ckpt, train_out = tmp_path / "ckpt", tmp_path / "train.npz"
    ref_out = tmp_path / "ref.npz"
    port = _free_port()
    run_processes(
        [
            _worker(
                "train",
                "--process-id",
                i,
                "--num-processes",
                2,
                "--port",
                port,
                "--checkpoint",
                ckpt,
                "--out",
                train_out,
                *which,
            )
            for i in range(2)
        ],
        _env(devices=4),
        tmp_path / "logs_train",
    )
    run_processes(
        [
            _worker(
                "reference",
                "--checkpoint",
                ckpt,
                "--out",
                ref_out,
                "--saved",
                train_out,
                *which,
            )
        ],
        _env(devices=8),
        tmp_path / "logs_reference",
    )
    with np.load(train_out) as f:
        train = dict(f)
    with np.load(ref_out) as f:
        reference = dict(f)
    for name in OPTIMIZERS:
        rtol = RELATIVE_TOLERANCE.get(name, 1e-5)
        # 2 processes (4 devices each) == 1 process (8 devices), params and state.
        _assert_close(
            _stage(train, name, "straight"), _stage(reference, name, "straight"), rtol
        )
        # (a) Restored by the 2 processes onto the same mesh: exactly what was
        # saved, and training continues bit-for-bit.
        _assert_identical(_stage(train, name, "restored"), _stage(train, name, "saved"))
        _assert_identical(
            _stage(train, name, "resumed"), _stage(train, name, "straight")
        )
        # (b) Restored by 1 process onto a 4-device mesh: exactly what was saved.
        _assert_identical(
            _stage(reference, name, "restored_other_mesh"),
            _stage(train, name, "saved"),
        )
        # Training continues bit-for-bit: the same steps on that mesh from the
        # saved values held in memory (not read from the checkpoint) give exactly
        # the same params and state.
        _assert_identical(
            _stage(reference, name, "resumed_other_mesh"),
            _stage(reference, name, "continued_other_mesh"),
        )
        # And equal, up to the order of float32 sums, to the 2 processes' run.
        _assert_close(
            _stage(reference, name, "resumed_other_mesh"),
            _stage(train, name, "straight"),
            rtol,
        )


def test_failed_process_is_reported_and_the_others_ended(tmp_path):
    # Process 0 waits for its peer at the coordinator; process 1 fails at once (an
    # unknown argument). The harness must report process 1's stderr (not a timeout,
    # nor process 0 failing at its own 60 s initialisation timeout) and end process 0
    # (`run_processes` returns only after every process has exited).
    port = _free_port()
    commands = [
        _worker(
            "train",
            "--process-id",
            0,
            "--num-processes",
            2,
            "--port",
            port,
            "--checkpoint",
            tmp_path,
            "--out",
            tmp_path / "out.npz",
        ),
        _worker(
            "train",
            "--checkpoint",
            tmp_path,
            "--out",
            tmp_path / "out.npz",
            "--no-such-option",
        ),
    ]
    with pytest.raises(ProcessFailed, match="(?s)process 1 of 2.*no-such-option"):
        run_processes(commands, _env(devices=4), tmp_path / "logs", timeout=60)
    assert not (tmp_path / "out.npz").exists()
