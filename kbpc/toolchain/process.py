"""Running the toolchain's programs (nvcc, the linker, strip) so that none outlives its compile.

Each runs under kbpc/toolchain/reaper.py in a process group of its own: `end_all()` kills every
group still running (a compile that fails, is interrupted or gets SIGTERM ends its other nvcc jobs
at once), and the reaper kills its group by itself when kbpc dies without a chance to clean up
(kill -9), through Linux's parent-death signal."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

_REAPER = Path(__file__).with_name("reaper.py")
_running: set[subprocess.Popen] = set()
_lock = threading.Lock()


def run_tool(cmd: list[str], cwd: Path | None = None,
             extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `cmd` to completion in its own process group, in the environment kbpc runs in plus
    `extra_env`; output captured as text."""
    env = {**os.environ, **extra_env} if extra_env else None   # passed through, not read
    wrapped = [sys.executable, "-I", str(_REAPER), str(os.getpid()), "--", *cmd]
    proc = subprocess.Popen(wrapped, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    with _lock:
        _running.add(proc)
    try:
        out, err = proc.communicate()
    except BaseException:
        _end(proc)
        raise
    finally:
        with _lock:
            _running.discard(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _end(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def end_all() -> None:
    """Kill every tool still running (each with everything it started)."""
    with _lock:
        running = list(_running)
    for proc in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
