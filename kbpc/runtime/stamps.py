"""The phase-stamp logs of a profiling build (`kbpc compile --stamps`, kernels/kbp_stamps.cuh): one
log per kernel instance in device memory, listed by the library's kbp_stamp_logs in the order of
the manifest's step.stamps. `clear` empties every log (before a replay), `read` copies them back:
per instance, one record for each CTA of its instrumented kernels that ran since the last clear.
What the times mean is bench/stamp_phases.py's business; this module only moves the bytes."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from kbpc.errors import BundleError, DeviceError

CAPACITY = 1 << 16          # kbp_stamps.cuh: kStampCapacity, records a log holds between clears
TIMES = 8                   # kStampTimes: t[0] begin, t[1] wait entered, t[2] wait left, .., t[7] end
RECORD = np.dtype([("grid", "<u8"), ("block", "<u4"), ("smid", "<u4"), ("t", "<u8", (TIMES,))])
assert RECORD.itemsize == 80      # StampRecord


@dataclass(frozen=True)
class StampLog:
    instance: str
    records: np.ndarray      # RECORD, one per CTA that ended (in the order they ended)
    began: int               # CTAs that began; more than CAPACITY: the log overflowed


class StampLogs:
    """The logs of one loaded library (a CudaBackend's), addressed once."""

    def __init__(self, lib: ctypes.CDLL, cuda, names: tuple[str, ...] | None):
        if names is None or not hasattr(lib, "kbp_stamp_logs"):
            raise BundleError("this bundle records no phase stamps: build it with `kbpc compile --stamps`")
        n = len(names)
        logs, counts = (ctypes.c_void_p * max(1, n))(), (ctypes.c_void_p * max(1, n))()
        lib.kbp_stamp_logs.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        err = lib.kbp_stamp_logs(logs, counts, n)
        if err != 0:
            raise DeviceError(f"the library's stamp logs do not match the manifest's {n} instances "
                              f"(kbp_stamp_logs returned {err})")
        self.cuda = cuda
        self.names = names
        self._logs = [int(logs[i]) for i in range(n)]
        self._counts = [int(counts[i]) for i in range(n)]

    def clear(self) -> None:
        """Empty every log: counts and records (a CTA that began and never reached its end stamp
        leaves its slot as clear made it, all zero, and `read` drops it)."""
        for log, count in zip(self._logs, self._counts):
            self.cuda.memset_d32(count, 0, 1)
            self.cuda.memset_d8(log, 0, CAPACITY * RECORD.itemsize)
        # Memsets are asynchronous, on the legacy stream, which the step's non-blocking streams do
        # not wait for: done before the next step is enqueued, or they could erase its stamps.
        self.cuda.Context.synchronize()

    def read(self) -> list[StampLog]:
        """Every instance's log since the last clear (call after the work has synchronized)."""
        out = []
        for name, log, count in zip(self.names, self._logs, self._counts):
            began = np.zeros(1, np.uint32)
            self.cuda.memcpy_dtoh(began, count)
            stored = min(int(began[0]), CAPACITY)
            records = np.zeros(stored, RECORD)
            if stored:
                self.cuda.memcpy_dtoh(records, log)
            out.append(StampLog(name, records[records["t"][:, TIMES - 1] != 0], int(began[0])))   # ended CTAs
        return out
