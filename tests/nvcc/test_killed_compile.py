"""A compile stopped in the middle of nvcc leaves nothing running and, once swept, nothing on disk:
SIGTERM ends every nvcc job and removes the build folder at once (exit 143); after kill -9 the
reapers end the nvcc jobs and the next compile sweeps the build folder."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbpc.bundle.keystore import generate_keys
from kbpc.toolchain.workdir import sweep

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _working_in(folder: Path) -> list[int]:
    """Processes whose working directory is inside `folder` (nvcc runs in the build folder)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if Path(os.readlink(proc / "cwd")).is_relative_to(folder):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def _start_and_wait_for_nvcc(tmp_path: Path, tiny_path: Path) -> tuple[subprocess.Popen, Path]:
    key = generate_keys(tmp_path / "keys").private
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-m", "kbpc.cli", "compile", str(tiny_path), "-o",
                             str(tmp_path / "out" / "tiny.kbp"), "--key", str(key), "--cache-dir", str(cache), "-j", "2"],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _working_in(cache / "tmp"):
        assert proc.poll() is None and time.monotonic() < deadline, "nvcc never started"
        time.sleep(0.1)
    return proc, cache


def _gone(cache: Path, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while _working_in(cache) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _working_in(cache)


def test_sigterm_ends_nvcc_and_cleans_up(tmp_path, tiny_path):
    proc, cache = _start_and_wait_for_nvcc(tmp_path, tiny_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    assert _gone(cache)
    assert list((cache / "tmp").iterdir()) == []
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_kill_9_ends_nvcc_and_the_next_compile_sweeps(tmp_path, tiny_path):
    proc, cache = _start_and_wait_for_nvcc(tmp_path, tiny_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _gone(cache), "nvcc (or what it started) outlived kbpc"
    left = list((cache / "tmp").iterdir())
    assert left                                   # nothing could remove it...
    assert sweep(cache / "tmp") > 0               # ...until the next compile sweeps
    assert list((cache / "tmp").iterdir()) == []
