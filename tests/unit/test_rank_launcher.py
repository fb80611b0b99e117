"""The one-host rank launcher's paths on the CPU, with fake rank processes that speak the protocol
(kbpc/runtime/ranks.py): the id relay and one result, and every failure ending all ranks within
seconds with an error naming the rank: a rank that exits, reports an error, is killed, never gets
ready, or hangs in the first step or a later one."""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

from kbpc.errors import DeviceError
from kbpc.runtime.ranks import Deadlines, launch_ranks, rank_command
from kbpc.settings import rank_environment

FAKE = r'''
import json, os, signal, sys, time
rank, mode, bad, pidfile = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
open(f"{pidfile}.{rank}", "w").write(str(os.getpid()))
def emit(**e):
    sys.stdout.write(json.dumps(e) + "\n"); sys.stdout.flush()
me_bad = rank == bad
if rank == 0:
    emit(event="id", id="ab" * 64)
    nccl = "ab" * 64
else:
    nccl = json.loads(sys.stdin.readline())["id"]
assert nccl == "ab" * 64
if me_bad and mode == "hang_ready":
    time.sleep(120)
emit(event="ready")
print("not a protocol line")
for n in range(1, 4):
    if me_bad and mode == "hang_first" and n == 1:
        time.sleep(120)
    if me_bad and mode == "hang_later" and n == 3:
        time.sleep(120)
    if me_bad and mode == "exit" and n == 2:
        sys.stderr.write("CUDA error: an illegal memory access\n"); sys.exit(3)
    if me_bad and mode == "kill" and n == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    if me_bad and mode == "error" and n == 1:
        emit(event="error", message="ncclAllGather: unhandled system error"); sys.exit(2)
    time.sleep(0.05)
    emit(event="step", n=n)
if rank == 0:
    emit(event="result", result={"generated_ids": [7, 8, 9], "env": os.environ.get("NCCL_NVLS_ENABLE"),
                                 "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")})
'''

QUICK = Deadlines(ready_s=3.0, first_step_s=2.0, step_s=2.0, grace_s=1.0)


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_rank.py"
    script.write_text(FAKE)
    pidfile = tmp_path / "pid"

    def command(mode: str, bad: int):
        return lambda rank: [sys.executable, str(script), str(rank), mode, str(bad), str(pidfile)]

    def pids(ranks: int) -> list[int]:
        return [int((tmp_path / f"pid.{r}").read_text()) for r in range(ranks) if (tmp_path / f"pid.{r}").exists()]

    return command, pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:   # a zombie has exited
        return fh.read().split()[2] != "Z"


def test_ranks_share_the_id_and_rank0_reports(fake):
    command, pids = fake
    events = []
    result = launch_ranks(command("ok", -1), 3, QUICK, on_event=lambda r, e: events.append((r, e["event"])))
    assert result["generated_ids"] == [7, 8, 9]
    assert result["env"] == "0" and result["gpu"] == "0"       # multicast off, one GPU per rank
    assert {r for r, e in events if e == "ready"} == {0, 1, 2}
    assert not any(_alive(p) for p in pids(3))


@pytest.mark.parametrize("mode,bad,message", [
    ("exit", 1, r"rank 1 exited with code 3 before the run finished: CUDA error: an illegal memory access"),
    ("kill", 0, r"rank 0 was killed by signal 9"),
    ("error", 2, r"rank 2: ncclAllGather: unhandled system error"),
    ("hang_ready", 1, r"rank 1 was not ready within 3 s"),
    ("hang_first", 2, r"rank 2 did not finish the first step within 2 s \(stuck in the first collective"),
    ("hang_later", 1, r"rank 1 made no progress for 2 s after step 2"),
])
def test_a_failed_rank_ends_every_rank_within_seconds(fake, mode, bad, message):
    command, pids = fake
    start = time.monotonic()
    with pytest.raises(DeviceError, match=message):
        launch_ranks(command(mode, bad), 3, QUICK)
    assert time.monotonic() - start < 10
    assert not any(_alive(p) for p in pids(3))


def test_rank_environment_keeps_the_visible_devices_mapping():
    env = rank_environment({"CUDA_VISIBLE_DEVICES": "4,5"}, 1)
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and env["NCCL_NVLS_ENABLE"] == "0"
    assert rank_environment({"NCCL_NVLS_ENABLE": "0"}, 0)["CUDA_VISIBLE_DEVICES"] == "0"


def test_rank_command_runs_the_worker_with_its_rank():
    cmd = rank_command({"bundle": "m.kbp", "ranks": 2})(1)
    assert cmd[:3] == [sys.executable, "-m", "kbpc.runtime.rank_worker"]
    assert json.loads(cmd[3]) == {"bundle": "m.kbp", "ranks": 2, "rank": 1}


def test_a_worker_that_cannot_open_its_bundle_reports_an_error(tmp_path):
    """The real rank worker's failure path: a clear error event and exit code 2 (on a machine
    without a default keyring the worker refuses for that reason first)."""
    with pytest.raises(DeviceError, match=r"rank \d: .*(not found|no such|no --trust keyring)"):
        launch_ranks(rank_command({"bundle": str(tmp_path / "missing.kbp"), "ranks": 2, "weights": "synthetic:0",
                                   "prompt": [1], "max_new_tokens": 1, "trust": None, "timeout_s": 5}),
                     2, Deadlines(ready_s=60, grace_s=1.0))


def test_run_tp_on_the_cpu_and_refusals(tiny_path):
    from click.testing import CliRunner

    from kbpc.cli import main

    ok = CliRunner().invoke(main, ["run", str(tiny_path), "--tp", "2", "--backend", "reference",
                                   "--max-new-tokens", "3", "--json"])
    assert ok.exit_code == 0, ok.output
    got = json.loads(ok.output)
    assert got["backend"] == "reference x2 ranks" and len(got["generated_ids"]) == 3
    refused = CliRunner().invoke(main, ["run", str(tiny_path), "--tp", "2", "--max-new-tokens", "1"])
    assert refused.exit_code == 2 and "compile it with --tp 2 first" in refused.output
    odd = CliRunner().invoke(main, ["run", str(tiny_path), "--tp", "3", "--backend", "reference"])
    assert odd.exit_code == 2 and "does not split over 3 ranks" in odd.output
