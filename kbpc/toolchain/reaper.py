"""Run one tool (nvcc, the linker, strip) so that it cannot outlive the compile that started it.

    python3 -I reaper.py PARENT_PID -- COMMAND ...

kbpc starts this script in a new process group (kbpc/toolchain/process.py); it runs COMMAND in
that group and exits with its status. The kernel sends it SIGTERM when the thread that started it
dies (PR_SET_PDEATHSIG), however that happens (an exception, Ctrl-C, kill -9), and it then kills
the whole group: nvcc and everything nvcc started (cudafe++, cicc, ptxas, gcc), which nvcc itself
leaves running when it is killed. A plain file with no kbpc imports, so it starts in milliseconds."""
import ctypes
import os
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1


def _end_group(*_args) -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)


def main() -> int:
    parent, sep, command = sys.argv[1], sys.argv[2], sys.argv[3:]
    if sep != "--" or not command:
        print("usage: reaper.py PARENT_PID -- COMMAND ...", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _end_group)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return 126
    if os.getppid() != int(parent):   # the compile died before the line above took effect
        return 125
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
