"""Nothing outlives a killed compile: tools run in process groups of their own that end with the
compile (an exception, end_all(), or kill -9 of kbpc itself through the reaper's parent-death
signal), and a writer killed in the middle of an atomic write leaves a temporary that the next
write to that path removes (kbpc/util/atomic.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kbpc.toolchain.process import end_all, run_tool
from kbpc.util.atomic import atomic_writer

REPO = Path(__file__).resolve().parents[2]
# a tool that starts a grandchild and waits for it: the grandchild's pid goes to the file
_TOOL = "sleep 60 & echo $! > {pidfile}; wait"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(") ", 1)[1][0] != "Z"


def _wait_for(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_end_all_kills_the_tool_and_what_it_started(tmp_path):
    pidfile = tmp_path / "pid"
    result = {}
    worker = threading.Thread(target=lambda: result.update(
        proc=run_tool(["sh", "-c", _TOOL.format(pidfile=pidfile)])))
    worker.start()
    assert _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip())
    grandchild = int(pidfile.read_text())
    t0 = time.monotonic()
    end_all()
    worker.join(10)
    assert not worker.is_alive() and time.monotonic() - t0 < 5
    assert result["proc"].returncode != 0
    assert _wait_for(lambda: not _alive(grandchild))


def test_kill_9_of_kbpc_ends_its_tools(tmp_path):
    pidfile = tmp_path / "pid"
    parent = subprocess.Popen([sys.executable, "-c",
                               "import sys; from kbpc.toolchain.process import run_tool; "
                               f"run_tool(['sh', '-c', {_TOOL.format(pidfile=pidfile)!r}])"],
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    assert _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip())
    grandchild = int(pidfile.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _wait_for(lambda: not _alive(grandchild)), "the tool outlived kbpc"


def test_killed_writer_leaves_nothing_after_the_next_write(tmp_path):
    out = tmp_path / "model.kbp"
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from kbpc.util.atomic import atomic_writer\n"
        "with atomic_writer(Path(sys.argv[1])) as fh:\n"
        "    fh.write(bytes(1 << 20)); fh.flush(); print('writing', flush=True); time.sleep(60)\n"), str(out)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert writer.stdout.readline().strip() == "writing"
    temps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(temps) == 1
    old = time.time() - 60
    os.utime(temps[0], (old, old))
    with atomic_writer(out) as fh:          # a live writer's temporary is kept
        fh.write(b"first")
    assert temps[0].exists()
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    with atomic_writer(out) as fh:          # a dead writer's temporary is removed
        fh.write(b"second")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.kbp"]
    assert out.read_bytes() == b"second"
