"""GPU tests and benchmarks launch kernels through the product's own launchers: a KernelInstance is
rendered with templates/kernel_instance.cu.j2 (the same typed host launcher the step program
calls, PDL flag included), plus a small C shim that unpacks an argument array, compiled into a
shared library and called with ctypes. The library uses the CUDA runtime, which shares the primary
context PyCUDA retains, so PyCUDA device arrays can be passed in directly.

    inst = KernelInstance("rms_norm", "rms_norm.cuh", "kbp::rms_norm<...>", ("const __nv_bfloat16*", "int", ...))
    launch = launcher(inst)
    launch((grid, 1, 1), (256, 1, 1), x_gpu, np.int32(4096), ..., smem=0)

Arguments, in the instance's parameter order: a PyCUDA GPUArray or DeviceAllocation (a device
pointer), None (a null pointer), a Python or NumPy int or float (converted to the parameter's C
type), or bytes / a NumPy array for a by-value struct (its size must equal sizeof the parameter,
which the shim reports). Each mismatch is an error before anything is launched."""
from __future__ import annotations

import ctypes
import hashlib
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from kbpc.toolchain.nvcc import compile_cuda
from kbpc.codegen.emit import _env
from kbpc.codegen.records import KernelInstance
from kbpc.targets import get_target
from kbpc.testing.gpu import _CACHE_DIR, _cuda, headers_digest

SCALARS = {"int": ctypes.c_int32, "unsigned int": ctypes.c_uint32, "float": ctypes.c_float,
           "long": ctypes.c_int64, "size_t": ctypes.c_uint64, "int64_t": ctypes.c_int64,
           "uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32}

SHIM = """
extern "C" const unsigned long long kbp_test_param_bytes[] = {{{sizes}}};
extern "C" int kbp_test_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned long long smem, int pdl, void* stream, void** a) {{
    (void)a;
    return (int)kbp_launch_{name}(dim3(gx, gy, gz), dim3(bx, by, bz), (size_t)smem, (cudaStream_t)stream, pdl{args});
}}
"""


class LaunchError(RuntimeError):
    pass


def render_launcher(inst: KernelInstance) -> str:
    """The instance's TU exactly as the product renders it (its typed host launcher)."""
    return _env().get_template("kernel_instance.cu.j2").render(inst=inst)


def render_instance(inst: KernelInstance) -> str:
    """The instance's TU exactly as the product renders it, plus the test shim."""
    tu = render_launcher(inst)
    sizes = ", ".join(f"sizeof({p})" for p in inst.params) or "0"
    args = "".join(f", *({p}*)a[{i}]" for i, p in enumerate(inst.params))
    return tu + SHIM.format(sizes=sizes, name=inst.name, args=args)


class Launcher:
    def __init__(self, inst: KernelInstance, library: Path):
        self.inst = inst
        self._lib = ctypes.CDLL(str(library))
        self._fn = self._lib.kbp_test_launch
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_ulonglong, ctypes.c_int, ctypes.c_void_p,
                                                   ctypes.POINTER(ctypes.c_void_p)]
        n = max(1, len(inst.params))
        self.param_bytes = list((ctypes.c_ulonglong * n).in_dll(self._lib, "kbp_test_param_bytes"))[:len(inst.params)]

    def _value(self, i: int, ctype: str, arg):
        """A ctypes object holding argument i as the parameter's C type."""
        if ctype.rstrip().endswith("*"):
            if arg is None:
                return ctypes.c_void_p(0)
            ptr = getattr(arg, "gpudata", arg)
            return ctypes.c_void_p(int(ptr))
        scalar = SCALARS.get(ctype.removeprefix("const ").strip())
        if scalar is not None:
            if isinstance(arg, (bytes, np.ndarray)) and not np.isscalar(arg):
                raise LaunchError(f"argument {i} ({ctype}) wants a scalar, got {type(arg).__name__}")
            return scalar(arg.item() if isinstance(arg, np.generic) else arg)
        raw = arg.tobytes() if isinstance(arg, np.ndarray) else bytes(arg)
        if len(raw) != self.param_bytes[i]:
            raise LaunchError(f"argument {i} ({ctype}) is {len(raw)} bytes, sizeof is {self.param_bytes[i]}")
        return ctypes.create_string_buffer(raw, len(raw))

    def __call__(self, grid, block, *args, smem: int = 0, pdl: bool = False, sync: bool = True,
                 stream=None) -> None:
        """Launch on `stream` (a PyCUDA Stream, a raw handle, or None: the legacy default stream),
        then synchronize the context unless sync is False (benchmarks, graph capture)."""
        if len(args) != len(self.inst.params):
            raise LaunchError(f"{self.inst.kernel} takes {len(self.inst.params)} arguments, got {len(args)}")
        grid, block = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
        values = [self._value(i, p, a) for i, (p, a) in enumerate(zip(self.inst.params, args))]
        ptrs = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
                                                         for v in values])
        handle = getattr(stream, "handle", stream) or 0
        err = self._fn(*grid, *block, smem, int(pdl), ctypes.c_void_p(int(handle)), ptrs)
        if err:
            raise LaunchError(f"launching {self.inst.kernel} failed: CUDA error {err}")
        if sync:
            _cuda().Context.synchronize()


@lru_cache(maxsize=None)
def launcher(inst: KernelInstance, target: str = "sm_90", flags: tuple[str, ...] = ()) -> Launcher:
    """Compile (cached by content: source, target, flags, every kernels/ header) and load the
    launcher. flags: extra nvcc flags beyond the product's, e.g. -DKBP_FAST_MATH for a test of the
    headers' fast-math build."""
    _cuda()
    source = render_instance(inst)
    key = hashlib.sha256("\0".join((source, target, *flags, headers_digest())).encode()).hexdigest()[:20]
    lib = _CACHE_DIR / f"launch-{inst.name[:40]}-{key}.so"
    if not lib.exists():
        src = lib.with_suffix(".cu")
        src.parent.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed: test workers that build the same launcher at once must never
        # hand nvcc a file another worker is still writing (measured: a truncated source failed
        # to compile in one of 63 DSA tests run by 8 workers).
        part = src.with_name(f"{src.name}.{os.getpid()}.part")
        part.write_text(source)
        os.replace(part, src)
        compile_cuda(src, lib, get_target(target), kind="shared", extra_flags=flags)
    return Launcher(inst, lib)
