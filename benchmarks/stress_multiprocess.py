"""Run the two-process training of tests/test_multiprocess.py many times and report
hangs (not part of CI: one run takes about a minute on 2 cores).

    python benchmarks/stress_multiprocess.py                    # 20 runs, SOAP+Shampoo
    python benchmarks/stress_multiprocess.py --runs 5 --nproc default --dump /tmp/d
    python benchmarks/stress_multiprocess.py --quick      # 1 run of AdamW alone

Each run starts the two `train` processes of the test (4 CPU devices each, Gloo
collectives, every Shampoo and SOAP with its default `spread=True`) with the test's
environment and waits at most `--timeout` seconds. A process still running then is a
hang: its native thread stacks are taken with gdb (when gdb is installed) and its
Python stack is printed by the worker's `faulthandler` (`--dump-after`), and both
are written under `--logs`. `--nproc default` leaves XLA's CPU thread pool at its
default size (max(cores, devices)) instead of the test's `NPROC=16`; `--dump DIR`
writes each process's optimized HLO (`--xla_dump_to`) for the collectives it runs.

Prints one line per run and a summary: `hangs: H of N`.
"""

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time


ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import test_multiprocess as tm  # noqa: E402


def native_stacks(pid: int) -> str:
    """Every thread's native stack of process `pid` (gdb), or why not."""
    if shutil.which("gdb") is None:
        return "(gdb not installed)"
    try:
        out = subprocess.run(
            ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        return "(gdb timed out)"
    return out.stdout + out.stderr


def one_run(i: int, args, logs: pathlib.Path) -> tuple[str, float]:
    """`("ok" | "hang" | "failed", seconds)` of one pair of train processes."""
    env = tm._env(devices=4)
    if args.nproc == "default":
        env.pop("NPROC", None)
    else:
        env["NPROC"] = args.nproc
    envs = [dict(env) for _ in range(2)]
    if args.dump:
        for p, e in enumerate(envs):
            dump = pathlib.Path(args.dump) / f"run{i}" / f"process{p}"
            e["XLA_FLAGS"] = (
                f"{e.get('XLA_FLAGS', '')} --xla_dump_to={dump} --xla_dump_hlo_as_text"
            )
    run_logs = logs / f"run{i}"
    # A fresh folder: Orbax refuses to write a checkpoint over an earlier one.
    shutil.rmtree(run_logs, ignore_errors=True)
    run_logs.mkdir(parents=True)
    port = tm._free_port()
    commands = [
        [
            sys.executable,
            str(tm.WORKER),
            "train",
            "--process-id",
            str(p),
            "--num-processes",
            "2",
            "--port",
            str(port),
            "--checkpoint",
            str(run_logs / "ckpt"),
            "--out",
            str(run_logs / "out.npz"),
            "--optimizers",
            args.optimizers,
            # A hung process prints its Python stack (after gdb has had its look).
            "--dump-after",
            str(args.timeout + 150),
        ]
        for p in range(2)
    ]
    procs = []
    start = time.monotonic()
    for p, command in enumerate(commands):
        out = open(run_logs / f"{p}.out", "w")
        err = open(run_logs / f"{p}.err", "w")
        procs.append(
            (
                subprocess.Popen(
                    command, cwd=ROOT, env=envs[p], stdout=out, stderr=err
                ),
                out,
            )
        )
    result = "ok"
    try:
        while True:
            codes = [p.poll() for p, _ in procs]
            if any(c not in (None, 0) for c in codes):
                result = "failed"
                break
            if all(c == 0 for c in codes):
                break
            if time.monotonic() - start > args.timeout:
                result = "hang"
                for p, (proc, _) in enumerate(procs):
                    (run_logs / f"{p}.gdb").write_text(native_stacks(proc.pid))
                # The worker's faulthandler prints the Python stacks and exits.
                for proc, _ in procs:
                    try:
                        proc.wait(timeout=200)
                    except subprocess.TimeoutExpired:
                        pass
                break
            time.sleep(0.2)
    finally:
        for proc, out in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            out.close()
    return result, time.monotonic() - start


def last_step(path: pathlib.Path) -> str:
    lines = [
        line
        for line in path.read_text(errors="replace").splitlines()
        if line.startswith(("step ", "train: "))
    ]
    return " / ".join(lines[-2:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--optimizers", default="SOAP,Shampoo")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--nproc", default="16", help="NPROC, or 'default'")
    parser.add_argument("--dump", default="", help="--xla_dump_to folder")
    parser.add_argument("--logs", default="", help="default: a new temporary folder")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 1 run of AdamW alone"
    )
    args = parser.parse_args()
    if args.quick:
        args.runs, args.optimizers = 1, "AdamW"
    logs = pathlib.Path(args.logs or tempfile.mkdtemp(prefix="stress_multiprocess_"))
    print(
        f"{args.runs} runs of the two-process training ({args.optimizers}), "
        f"NPROC={args.nproc}, timeout {args.timeout:.0f} s, logs in {logs}",
        flush=True,
    )
    counts = {"ok": 0, "hang": 0, "failed": 0}
    for i in range(args.runs):
        result, seconds = one_run(i, args, logs)
        counts[result] += 1
        where = ""
        if result != "ok":
            where = "; " + " | ".join(
                f"process {p}: {last_step(logs / f'run{i}' / f'{p}.err')}"
                for p in range(2)
            )
        print(f"run {i + 1:2d}: {result:6s} {seconds:6.1f} s{where}", flush=True)
    print(
        f"hangs: {counts['hang']} of {args.runs}; failures: {counts['failed']}; "
        f"passed: {counts['ok']}",
        flush=True,
    )
    return 1 if counts["hang"] or counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
