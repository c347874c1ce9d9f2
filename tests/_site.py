"""The documentation site, built once per test run and shared by the modules that read
it (`test_docs.py`, `test_browser.py`), also across pytest-xdist workers."""

import fcntl
import os
import pathlib
import subprocess
import sys


ROOT = pathlib.Path(__file__).resolve().parents[1]


def build_site(tmp_path_factory) -> pathlib.Path:
    """`mkdocs build --strict` into a folder of this test run; built by the first
    caller, the others wait for it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' folders are inside the run's folder
    site, failure = root / "site", root / "site-build-failed.txt"
    with open(root / "site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (site / "index.html").exists() and not failure.exists():
            mkdocs = pathlib.Path(sys.executable).with_name("mkdocs")
            proc = subprocess.run(
                [str(mkdocs), "build", "--strict", "--site-dir", str(site)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if proc.returncode != 0:
                failure.write_text(proc.stderr[-6000:])
    assert not failure.exists(), f"mkdocs build --strict failed:\n{failure.read_text()}"
    return site
