"""The local GPU as the runner sees it: its name, compute capability and kbpc target, the check
that a bundle was built for it (made before any of the bundle's native code is loaded), and its
measured copy bandwidth (the yardstick of `kbpc bench`)."""
from __future__ import annotations

from dataclasses import dataclass

from kbpc.errors import DeviceError, KbpcError
from kbpc.targets import TARGETS, target_for_capability

COPY_BYTES = 256 << 20     # large enough to stream from memory, not from the 50-60 MB L2
COPY_REPEATS = 10


@dataclass(frozen=True)
class Device:
    name: str
    capability: tuple[int, int]
    target: str | None        # the kbpc target that runs here, None if there is none

    def describe(self) -> str:
        cc = f"compute capability {self.capability[0]}.{self.capability[1]}"
        return f"{self.target or 'no kbpc target'} ({self.name}, {cc})"


def device_from(name: str, capability: tuple[int, int]) -> Device:
    try:
        target = target_for_capability(capability).name
    except KbpcError:
        target = None
    return Device(name, tuple(capability), target)


def local_device(cuda=None) -> Device:
    """The GPU the runner uses (device 0 of the primary context)."""
    if cuda is None:
        from kbpc.runtime.cuda_backend import cuda_driver
        cuda = cuda_driver()
    dev = cuda.Context.get_device()
    return device_from(dev.name(), dev.compute_capability())


def check_bundle_target(bundle_target: str, device: Device) -> None:
    """Refuse, with both names, a bundle built for another GPU than this one."""
    if bundle_target == device.target:
        return
    built = TARGETS.get(bundle_target)
    built_for = f"{bundle_target} ({built.gpus})" if built else repr(bundle_target)
    hint = (f"; compile it again with --target {device.target}" if device.target
            else "; kbpc cannot build for this GPU")
    raise DeviceError(f"the bundle was built for {built_for}, this GPU is {device.describe()}{hint}")


def measure_copy_bandwidth(cuda, nbytes: int = COPY_BYTES, repeats: int = COPY_REPEATS) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting what is read and what is written (the
    convention of the bandwidth floors): the best of `repeats` timed copies after one warm-up."""
    src, dst = cuda.mem_alloc(nbytes), cuda.mem_alloc(nbytes)
    try:
        start, end = cuda.Event(), cuda.Event()
        cuda.memcpy_dtod(dst, src, nbytes)
        best = float("inf")
        for _ in range(repeats):
            start.record()
            cuda.memcpy_dtod(dst, src, nbytes)
            end.record()
            end.synchronize()
            best = min(best, end.time_since(start) * 1e-3)
        if not best > 0:
            raise DeviceError("the copy-bandwidth measurement timed nothing")
        return 2 * nbytes / best
    finally:
        src.free()
        dst.free()
