"""The CUDA backend: a thin PyCUDA runner around a verified bundle's library.

The runner owns memory (weights, arena, state) through PyCUDA on the primary context that
`pycuda.autoprimaryctx` retains; the bundle's library (loaded with ctypes, sharing that context)
captures the step into a CUDA graph and replays it. The greedy token is picked on the GPU with
`argmax_host`'s math (runtime_stub/kbp_greedy.cu): `next_token` reads back 8 bytes a step, `step`
also copies the logits row (libraries built before kbp_greedy pick it on the host)."""
from __future__ import annotations

import ctypes
import tempfile
from pathlib import Path

import numpy as np

from kbpc.errors import BundleError, DeviceError, WeightsError
from kbpc.ir.weights import weight_specs
from kbpc.reference.argmax_host import argmax_host
from kbpc.reference.formats import bf16_from_bits
from kbpc.runtime.bound_weights import check_hf_folder, resolve_source, stream_weights
from kbpc.runtime.bundle_model import BundleModel
from kbpc.runtime.device import check_bundle_target, local_device
from kbpc.weights.hf_checkpoint import check_config, is_hf_folder
from kbpc.weights.synthetic import (BLOCK_SCALE_CODES, FP8_WEIGHT_CODES, parse_seed, rule_for,
                                    tensor_key)

_KIND = {"uniform": 0, "codes": 1, "scale_codes": 2, "fp8_codes": 3}
_STORAGE = {"f32": 0, "bf16": 1, "e4m3": 2, "e2m1x2": 2}


class KbpStepInfo(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_int), ("weights", ctypes.c_int), ("state", ctypes.c_int),
                ("arena_bytes", ctypes.c_ulonglong), ("streams", ctypes.c_int), ("events", ctypes.c_int),
                ("launches", ctypes.c_int), ("marks", ctypes.c_int), ("vocab", ctypes.c_int), ("logits_bytes", ctypes.c_ulonglong),
                ("plan_digest", ctypes.c_char_p), ("blueprint_id", ctypes.c_char_p), ("target", ctypes.c_char_p),
                ("comm_bytes", ctypes.c_ulonglong), ("tp_rank", ctypes.c_int), ("tp_ranks", ctypes.c_int)]


def cuda_driver():
    try:
        import pycuda.autoprimaryctx  # noqa: F401  (retains the device's primary context)
        import pycuda.driver as cuda
    except ImportError:
        raise DeviceError("the CUDA backend needs PyCUDA: pip install 'kbpc[gpu]'") from None
    except Exception as exc:  # no driver, no device
        raise DeviceError(f"no usable NVIDIA GPU: {exc}") from None
    return cuda


def _load_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.kbp_info.restype = ctypes.POINTER(KbpStepInfo)
    lib.kbp_weight_sizes.restype = ctypes.POINTER(ctypes.c_ulonglong)
    lib.kbp_state_sizes.restype = ctypes.POINTER(ctypes.c_ulonglong)
    lib.kbp_create.restype = ctypes.c_void_p
    lib.kbp_create.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    lib.kbp_step.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.kbp_sync.argtypes = [ctypes.c_void_p]
    lib.kbp_logits.restype = ctypes.c_void_p
    lib.kbp_logits.argtypes = [ctypes.c_void_p]
    lib.kbp_destroy.argtypes = [ctypes.c_void_p]
    lib.kbp_last_error.restype = ctypes.c_char_p
    lib.kbp_profile_step.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
    if hasattr(lib, "kbp_greedy"):        # libraries of earlier bundles lack it
        lib.kbp_greedy.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    if hasattr(lib, "kbp_graph_edges"):   # libraries of earlier bundles lack it
        lib.kbp_graph_edges.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    lib.kbp_fill_synthetic.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_int,
                                       ctypes.c_float, ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return lib


class CudaBackend:
    """One sequence on one GPU. `step(token)` -> (logits float32, greedy token);
    `next_token(token)` -> (greedy token, non-finite logits), without the logits row."""

    def __init__(self, model: BundleModel, weights_source: str | None, max_context: int | None = None,
                 use_graph: bool = True):
        """`weights_source`: see kbpc/runtime/bound_weights.py (None: the bundle's own, or synthetic:0)."""
        self.cuda = cuda = cuda_driver()
        self.model = model
        run = model.run
        tp_size = int(model.manifest.get("tp_size") or 1)
        if tp_size > 1:
            raise DeviceError(f"this bundle is split over {tp_size} ranks: kbpc run --tp {tp_size} runs it, "
                              "one process per GPU (docs/tensor-parallel.md)")
        self.max_context = run.max_context
        if max_context is not None and max_context > self.max_context:
            raise DeviceError(f"context {max_context} exceeds the bundle's --max-context {self.max_context}")
        check_bundle_target(run.target, local_device(cuda))   # before loading its code
        self.specs = weight_specs(model.blueprint)   # (the synthetic generator's rules need the specs)
        if [(s.name, s.nbytes) for s in self.specs] != [(w.name, w.nbytes) for w in run.weights]:
            raise BundleError("the manifest's weights and its blueprint's disagree", str(model.bundle.path))
        self._tmp = tempfile.TemporaryDirectory(prefix="kbpc-run-")
        self.lib = _load_library(model.bundle.extract(run.library(0), Path(self._tmp.name)))
        info = self.lib.kbp_info().contents
        self.info = info
        self.vocab = info.vocab
        sizes = [self.lib.kbp_weight_sizes()[i] for i in range(info.weights)]
        if [w.nbytes for w in run.weights] != sizes:
            raise DeviceError("the bundle's library and its manifest disagree on weight sizes")
        state_sizes = [self.lib.kbp_state_sizes()[i] for i in range(info.state)]
        self._check_memory(sum(sizes) + sum(state_sizes) + info.arena_bytes)
        self.arena = cuda.mem_alloc(max(1, info.arena_bytes))
        cuda.memset_d8(self.arena, 0, max(1, info.arena_bytes))
        self.weights = [cuda.mem_alloc(max(1, n)) for n in sizes]
        self.state = [cuda.mem_alloc(max(1, n)) for n in state_sizes]
        self._load_weights(resolve_source(model, weights_source))
        self.reset()
        wptrs = (ctypes.c_void_p * max(1, len(self.weights)))(*[int(w) for w in self.weights])
        sptrs = (ctypes.c_void_p * max(1, len(self.state)))(*[int(s) for s in self.state])
        self._ptr_arrays = (wptrs, sptrs)
        self.handle = self.lib.kbp_create(int(self.arena), wptrs, sptrs, int(use_graph))
        if not self.handle:
            raise DeviceError(f"creating the step failed: {self.lib.kbp_last_error().decode()}")
        self.position = 0
        self._logits = np.empty(self.vocab, np.uint16)

    def graph_edges(self) -> tuple[int, int] | None:
        """(programmatic edges of the captured step graph, all its edges); None without a graph or
        in a library that does not report them (bundles built before kbp_graph_edges)."""
        if not hasattr(self.lib, "kbp_graph_edges"):
            return None
        prog, total = ctypes.c_int(), ctypes.c_int()
        if self.lib.kbp_graph_edges(self.handle, ctypes.byref(prog), ctypes.byref(total)) != 0:
            return None
        return prog.value, total.value

    def stamp_logs(self):
        """The phase-stamp logs of a profiling build (kbpc/runtime/stamps.py); BundleError otherwise."""
        from kbpc.runtime.stamps import StampLogs
        return StampLogs(self.lib, self.cuda, self.model.run.stamps)

    def _check_memory(self, needed: int) -> None:
        free, total = self.cuda.mem_get_info()
        if needed > free:
            raise DeviceError(f"the model needs {needed / 1e9:.2f} GB of GPU memory (weights, state for "
                              f"{self.max_context} tokens, arena) but the GPU has {free / 1e9:.2f} GB free "
                              f"of {total / 1e9:.2f} GB")

    def _load_weights(self, source: str) -> None:
        bp = self.model.blueprint
        if source.startswith("synthetic:"):
            seed = parse_seed(source)
            for spec, dst in zip(self.specs, self.weights):
                rule = rule_for(bp, spec)
                lo, hi = BLOCK_SCALE_CODES if rule.kind == "scale_codes" else FP8_WEIGHT_CODES
                count = int(np.prod(spec.shape, dtype=np.int64))
                err = self.lib.kbp_fill_synthetic(int(dst), count, int(tensor_key(seed, spec.name)), _KIND[rule.kind],
                                                  rule.scale, rule.offset, lo, hi, _STORAGE[spec.storage])
                if err:
                    raise DeviceError(f"generating {spec.name} on the GPU failed (CUDA error {err})")
            return
        dst_of = {spec.name: int(dst) for spec, dst in zip(self.specs, self.weights)}
        if source != "embedded" and not Path(source).exists():
            raise WeightsError("no such checkpoint file or folder (or use synthetic:SEED)", source)
        if source != "embedded" and is_hf_folder(Path(source)):   # converted node by node
            check_hf_folder(self.model, Path(source))
            for spec, arr in check_config(bp, Path(source)).convert():
                self.cuda.memcpy_htod(dst_of[spec.name], arr)
            return

        def to_gpu(spec, offset: int, view: memoryview) -> None:   # each byte copied as it is read
            self.cuda.memcpy_htod(dst_of[spec.name] + offset, np.frombuffer(view, np.uint8))

        stream_weights(self.model, source, self.specs, to_gpu)

    def reset(self) -> None:
        """A new sequence: zero the state and caches, identity block tables."""
        for spec, buf in zip(self.model.run.state, self.state):
            self.cuda.memset_d8(buf, 0, max(1, spec.nbytes))
            if spec.name.endswith(".block_table"):
                self.cuda.memcpy_htod(buf, np.arange(spec.shape[0], dtype=np.int32))
        self.position = 0

    def _enqueue(self, token: int) -> None:
        if self.position >= self.max_context:
            raise DeviceError(f"context is full ({self.max_context} tokens)")
        if self.lib.kbp_step(self.handle, int(token), self.position):
            raise DeviceError(f"decode step failed: {self.lib.kbp_last_error().decode()}")
        self.position += 1

    def greedy(self) -> tuple[int, int]:
        """(greedy token, infinite or NaN logits) of the logits the last step left, computed on the
        GPU; waits for the step. Libraries without kbp_greedy copy the row and scan it here."""
        if not hasattr(self.lib, "kbp_greedy"):
            logits = self.logits()
            return int(argmax_host(logits)), int((~np.isfinite(logits)).sum())
        token, bad = ctypes.c_int(), ctypes.c_int()
        if self.lib.kbp_greedy(self.handle, ctypes.byref(token), ctypes.byref(bad)):
            raise DeviceError(f"decode step failed: {self.lib.kbp_last_error().decode()}")
        return token.value, bad.value

    def logits(self) -> np.ndarray:
        """The last step's logits as float32 (waits for the step)."""
        if self.lib.kbp_sync(self.handle):
            raise DeviceError(f"decode step failed: {self.lib.kbp_last_error().decode()}")
        self.cuda.memcpy_dtoh(self._logits, self.lib.kbp_logits(self.handle))
        return bf16_from_bits(self._logits)

    def next_token(self, token: int) -> tuple[int, int]:
        """Feed one token; (greedy next token, non-finite logits): 8 bytes come back, not the row."""
        self._enqueue(token)
        return self.greedy()

    def step(self, token: int) -> tuple[np.ndarray, int]:
        self._enqueue(token)
        nxt, _ = self.greedy()
        return self.logits(), nxt

    def profile_step(self, token: int) -> np.ndarray:
        """Milliseconds per profile mark of one serialized, eager step: per launch in issue order
        (ABI 4 libraries), per plan group in launch order (earlier ones)."""
        out = (ctypes.c_float * self.info.marks)()
        if self.lib.kbp_profile_step(self.handle, int(token), self.position, out):
            raise DeviceError(f"profiling failed: {self.lib.kbp_last_error().decode()}")
        self.position += 1
        return np.array(out, np.float64)

    def close(self) -> None:
        if getattr(self, "handle", None):
            self.lib.kbp_destroy(self.handle)
            self.handle = None
