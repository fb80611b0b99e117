"""Launching the ranks of a tensor-parallel bundle on one host: one process per GPU, a parent that
passes the NCCL unique id from rank 0 to the others and watches every rank, and one result.

Protocol (JSON lines; a rank writes events to its stdout, the parent writes to its stdin):
    rank 0 -> parent  {"event": "id", "id": HEX}        the NCCL unique id (ncclGetUniqueId)
    parent -> rank r  {"id": HEX}                       (ranks 1..R-1)
    rank   -> parent  {"event": "ready"}                communicator, weights and graph are set up
    rank   -> parent  {"event": "step", "n": N}         N steps done (a heartbeat per step)
    rank 0 -> parent  {"event": "result", "result": {...}}   (final once every rank exits with 0)
    rank   -> parent  {"event": "error", "message": M}  then it exits with code 2

A rank that exits before the result, or reports an error, ends the others (SIGTERM, then SIGKILL
after a grace period) and the launch fails naming it. Deadlines: every rank ready within
`ready_s` of the start, the first step within `first_step_s` of the last rank's ready (a rank
stuck in the first collective), and every later step within `step_s` of the one before; a
missed deadline ends every rank. Ranks also bound their own waits (runtime_stub/kbp_tp.cu), so a
rank left alone by a dead peer ends by itself."""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kbpc.errors import DeviceError
from kbpc.settings import process_environment, rank_environment


@dataclass(frozen=True)
class Deadlines:
    ready_s: float = 900.0            # compile-free start: load weights, create the communicator
    first_step_s: float = 60.0        # the first step, i.e. the first collectives
    step_s: float = 60.0              # each later step
    grace_s: float = 3.0              # SIGTERM -> SIGKILL


@dataclass
class _Rank:
    rank: int
    proc: subprocess.Popen
    stderr: Any
    buffer: bytes = b""
    ready: bool = False
    done: bool = False                # exited with code 0
    steps: int = 0
    last: float = field(default_factory=time.monotonic)


def launch_ranks(command: Callable[[int], list[str]], ranks: int, deadlines: Deadlines = Deadlines(),
                 on_event: Callable[[int, dict], None] | None = None) -> dict:
    """Start `ranks` processes (`command(rank)`, rank r on GPU r), relay the NCCL id, watch them and
    return rank 0's result. Raises DeviceError naming the rank that failed or missed a deadline."""
    procs: list[_Rank] = []
    base = process_environment()
    try:
        for r in range(ranks):
            err = tempfile.TemporaryFile()
            proc = subprocess.Popen(command(r), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                    env=rank_environment(base, r), start_new_session=True)
            procs.append(_Rank(r, proc, err))
        return _watch(procs, deadlines, on_event)
    finally:
        _end(procs, deadlines.grace_s)


def _watch(procs: list[_Rank], d: Deadlines, on_event) -> dict:
    """Until every rank has exited cleanly (rank 0's result in hand), or one fails."""
    sel = selectors.DefaultSelector()
    for p in procs:
        os.set_blocking(p.proc.stdout.fileno(), False)
        sel.register(p.proc.stdout, selectors.EVENT_READ, p)
    start = time.monotonic()
    all_ready: float | None = None
    result: dict | None = None
    while not all(p.done for p in procs):
        deadline, who, what = _next_deadline(procs, d, start, all_ready)
        events = sel.select(timeout=min(max(0.0, deadline - time.monotonic()), 0.5))
        for key, _ in events:
            p: _Rank = key.data
            chunk = p.proc.stdout.read()
            if not chunk:   # end of output: the rank exited (or closed its stdout)
                sel.unregister(key.fileobj)
                if _exit_code(p) != 0:
                    raise DeviceError(_exit_message(p))
                p.done, p.last = True, time.monotonic()
                continue
            p.buffer += chunk
            while b"\n" in p.buffer:
                line, p.buffer = p.buffer.split(b"\n", 1)
                result = _handle(p, line, procs, on_event) or result
        if all_ready is None and all(p.ready for p in procs):
            all_ready = time.monotonic()
        for p in procs:
            if p.proc.poll() is not None and p.proc.returncode != 0:
                raise DeviceError(_exit_message(p))
        if time.monotonic() > deadline and not all(p.done for p in procs):
            raise DeviceError(f"rank {who.rank} {what}; ended every rank")
    if result is None:
        raise DeviceError("rank 0 exited without a result")
    return result


def _exit_code(p: _Rank) -> int | None:
    try:
        return p.proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        return None


def _next_deadline(procs: list[_Rank], d: Deadlines, start: float, all_ready: float | None):
    if all_ready is None:
        late = next(p for p in procs if not p.ready)
        return start + d.ready_s, late, f"was not ready within {d.ready_s:g} s of the start"
    running = [p for p in procs if not p.done] or procs
    slowest = min(running, key=lambda p: p.steps)
    if slowest.steps == 0:
        return all_ready + d.first_step_s, slowest, (
            f"did not finish the first step within {d.first_step_s:g} s (stuck in the first collective: "
            "is a peer dead or on another bundle?)")
    return slowest.last + d.step_s, slowest, f"made no progress for {d.step_s:g} s after step {slowest.steps}"


def _handle(p: _Rank, line: bytes, procs: list[_Rank], on_event) -> dict | None:
    try:
        msg = json.loads(line)
    except json.JSONDecodeError:
        return None                      # not a protocol line (stray output): ignored
    if not isinstance(msg, dict):
        return None
    event = msg.get("event")
    if on_event:
        on_event(p.rank, msg)
    if event == "id":
        for other in procs[1:]:
            other.proc.stdin.write((json.dumps({"id": msg.get("id")}) + "\n").encode())
            other.proc.stdin.flush()
    elif event == "ready":
        p.ready, p.last = True, time.monotonic()
    elif event == "step":
        p.steps, p.last = int(msg.get("n", p.steps + 1)), time.monotonic()
    elif event == "error":
        raise DeviceError(f"rank {p.rank}: {msg.get('message', 'failed')}; ended every rank")
    elif event == "result" and p.rank == 0:
        return msg.get("result") or {}
    return None


def _exit_message(p: _Rank) -> str:
    code = _exit_code(p)
    p.stderr.seek(0)
    tail = p.stderr.read()[-2000:].decode(errors="replace").strip().splitlines()
    why = f": {tail[-1]}" if tail else ""
    how = f"exited with code {code}" if code is not None else "closed its output"
    if code is not None and code < 0:
        how = f"was killed by signal {-code}"
    return f"rank {p.rank} {how} before the run finished{why}; ended every rank"


def _end(procs: list[_Rank], grace_s: float) -> None:
    """SIGTERM every rank still running, SIGKILL any left after the grace period."""
    for p in procs:
        if p.proc.poll() is None:
            _signal(p.proc, signal.SIGTERM)
    stop = time.monotonic() + grace_s
    for p in procs:
        try:
            p.proc.wait(timeout=max(0.0, stop - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(p.proc, signal.SIGKILL)
            p.proc.wait()
        for f in (p.proc.stdin, p.proc.stdout, p.stderr):
            try:
                f.close()
            except OSError:
                pass


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)      # the rank's own session: its children too
    except (ProcessLookupError, PermissionError):
        pass


def rank_command(config: dict) -> Callable[[int], list[str]]:
    """The command of rank r: this Python running kbpc.runtime.rank_worker with its settings."""
    def command(rank: int) -> list[str]:
        return [sys.executable, "-m", "kbpc.runtime.rank_worker", json.dumps({**config, "rank": rank})]
    return command
