"""One rank of a tensor-parallel bundle on its GPU (one process per GPU, kbpc/runtime/ranks.py).

The rank loads NCCL (the library its artifact was linked against, by soname), its own library
(lib/rank{r}/libkbp.so), and only its shards of the checkpoint: a synthetic tensor is generated
whole on the GPU and its ranges copied out, a checkpoint tensor (memory-mapped) is sliced before
it is copied. A step: the captured graph (the all-gathers before each post-mix inside it), a
bounded wait, then the distributed argmax (each rank's best logit and its global index, exchanged
through NCCL and combined in rank order) and, for the caller's logits, the ranks' slices gathered."""
from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import numpy as np

from kbpc.errors import DeviceError, WeightsError
from kbpc.ir.parallel import Shard
from kbpc.ir.weights import STORAGE_BYTES, weight_specs
from kbpc.reference.formats import bf16_from_bits
from kbpc.reference.tensor_parallel import combine_argmax, local_argmax
from kbpc.report.parallel import lib_path
from kbpc.runtime.bundle_model import BundleModel
from kbpc.runtime.cuda_backend import _KIND, _STORAGE, _load_library, cuda_driver
from kbpc.util.nccl import find_nccl
from kbpc.weights.hf_checkpoint import check_config, is_hf_folder
from kbpc.weights.shards import checkpoint_shards
from kbpc.weights.synthetic import BLOCK_SCALE_CODES, FP8_WEIGHT_CODES, parse_seed, rule_for, tensor_key

ID_BYTES = 128          # sizeof(ncclUniqueId)


def _shard(w: dict) -> Shard | None:
    """A manifest weight entry's shard (None: the whole tensor)."""
    s = w["shard"]
    return None if s is None else Shard(int(s["axis"]), tuple((int(a), int(b)) for a, b in s["ranges"]))


def load_nccl() -> None:
    """Load NCCL globally so the rank library's libnccl.so.2 dependency resolves to it."""
    ctypes.CDLL(str(find_nccl().library), mode=ctypes.RTLD_GLOBAL)


def open_rank_library(model: BundleModel, rank: int, tmp: Path) -> ctypes.CDLL:
    load_nccl()
    lib = _load_library(model.bundle.extract(lib_path(rank), tmp))
    lib.kbp_tp_unique_id.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.kbp_tp_init.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.kbp_tp_wait.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
    lib.kbp_tp_exchange.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.kbp_tp_init_loopback.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.kbp_tp_last_error.restype = ctypes.c_char_p
    lib.kbp_stream.restype = ctypes.c_void_p
    lib.kbp_stream.argtypes = [ctypes.c_void_p]
    return lib


def unique_id(lib: ctypes.CDLL) -> bytes:
    buf = ctypes.create_string_buffer(ID_BYTES)
    if lib.kbp_tp_unique_id(buf, ID_BYTES):
        raise DeviceError(lib.kbp_tp_last_error().decode())
    return buf.raw


class TpRankBackend:
    """Rank `rank` of a split bundle; `step(token)` -> (full logits float32, greedy token), the
    same on every rank. Without an NCCL id (nccl_id None) the rank runs alone on its GPU with no
    NCCL call: `step_alone` takes the other ranks' partial outputs from the caller (tests)."""

    def __init__(self, model: BundleModel, lib: ctypes.CDLL, rank: int, nccl_id: bytes | None,
                 weights_source: str, timeout_s: float = 60.0):
        self.cuda = cuda = cuda_driver()
        tp = model.manifest.get("tp")
        if not tp or not 0 <= rank < tp["ranks"]:
            raise DeviceError(f"the bundle has no rank {rank}")
        self.model, self.lib, self.rank, self.ranks = model, lib, rank, tp["ranks"]
        self.timeout_ms = int(timeout_s * 1000)
        me = tp["per_rank"][rank]
        self.vocab_slices = [tuple(r["vocab"]) for r in tp["per_rank"]]
        self.vocab = sum(c for _, c in self.vocab_slices)
        info = lib.kbp_info().contents
        if info.tp_rank != rank or info.tp_ranks != self.ranks:
            raise DeviceError(f"lib/rank{rank} was built for rank {info.tp_rank} of {info.tp_ranks}")
        self.info = info
        self.shards = me["weights"]
        sizes = [lib.kbp_weight_sizes()[i] for i in range(info.weights)]
        self.full = {s.name: s for s in weight_specs(model.blueprint)}
        if len(sizes) != len(self.shards):
            raise DeviceError(f"lib/rank{rank} has {len(sizes)} weights, the manifest lists {len(self.shards)}")
        state_sizes = [lib.kbp_state_sizes()[i] for i in range(info.state)]
        self.arena = cuda.mem_alloc(max(1, info.arena_bytes))
        cuda.memset_d8(self.arena, 0, max(1, info.arena_bytes))
        self.weights = [cuda.mem_alloc(max(1, n)) for n in sizes]
        self.state = [cuda.mem_alloc(max(1, n)) for n in state_sizes]
        self._load(weights_source)
        self._reset_state(model.manifest["state"], state_sizes)
        slot = 2 * max(c for _, c in self.vocab_slices)
        self.sites = tp["sites"]
        self.region = None
        if nccl_id is None:
            self.region = cuda.mem_alloc(max(1, info.comm_bytes))
            cuda.memset_d8(self.region, 0, max(1, info.comm_bytes))
            failed = lib.kbp_tp_init_loopback(ctypes.c_void_p(int(self.region)), rank)
        else:
            failed = lib.kbp_tp_init(rank, self.ranks, nccl_id, len(nccl_id), self.timeout_ms, slot)
        if failed:
            raise DeviceError(lib.kbp_tp_last_error().decode())
        wptrs = (ctypes.c_void_p * max(1, len(self.weights)))(*[int(w) for w in self.weights])
        sptrs = (ctypes.c_void_p * max(1, len(self.state)))(*[int(s) for s in self.state])
        self._keep = (wptrs, sptrs)
        self.handle = lib.kbp_create(int(self.arena), wptrs, sptrs, 1)
        if not self.handle:
            raise DeviceError(f"creating the step failed: {lib.kbp_last_error().decode()}")
        self.stream = lib.kbp_stream(self.handle)
        self.position = 0
        self._local = np.empty(me["vocab"][1], np.uint16)

    def _reset_state(self, manifest_state: list, sizes: list[int]) -> None:
        """Zero state and caches; identity block tables. Every rank has the unsplit plan's state
        buffers in the same order (the split only resizes per-head state)."""
        if len(manifest_state) != len(sizes):
            raise DeviceError(f"lib/rank{self.rank} has {len(sizes)} state buffers, the manifest {len(manifest_state)}")
        for spec, buf, n in zip(manifest_state, self.state, sizes):
            self.cuda.memset_d8(buf, 0, max(1, n))
            if spec["name"].endswith(".block_table"):
                self.cuda.memcpy_htod(buf, np.arange(spec["shape"][0], dtype=np.int32))

    def _load(self, source: str) -> None:
        if source.startswith("synthetic:"):
            seed = parse_seed(source)
            for w, dst in zip(self.shards, self.weights):
                self._synthetic(self.full[w["name"]], w, dst, seed)
            return
        path = Path(source)
        if not path.exists():
            raise WeightsError("no such checkpoint file or folder (or use synthetic:SEED)", source)
        dst_of = {w["name"]: dst for w, dst in zip(self.shards, self.weights)}
        shard_of = {w["name"]: _shard(w) for w in self.shards}
        if is_hf_folder(path):   # converted tensor by tensor (whole), then cut
            for spec, arr in check_config(self.model.blueprint, path).convert():
                part = shard_of[spec.name].take(arr) if shard_of[spec.name] else arr
                self.cuda.memcpy_htod(dst_of[spec.name], np.ascontiguousarray(part))
            return
        parts = [(self.full[w["name"]], shard_of[w["name"]]) for w in self.shards]
        for name, part in checkpoint_shards(path, parts):
            self.cuda.memcpy_htod(dst_of[name], part)

    def _synthetic(self, spec, w: dict, dst, seed: int) -> None:
        rule = rule_for(self.model.blueprint, spec)
        lo, hi = BLOCK_SCALE_CODES if rule.kind == "scale_codes" else FP8_WEIGHT_CODES
        count = int(np.prod(spec.shape, dtype=np.int64))
        full = dst if w["shard"] is None else self.cuda.mem_alloc(max(1, spec.nbytes))
        err = self.lib.kbp_fill_synthetic(int(full), count, int(tensor_key(seed, spec.name)), _KIND[rule.kind],
                                          rule.scale, rule.offset, lo, hi, _STORAGE[spec.storage])
        if err:
            raise DeviceError(f"generating {spec.name} on the GPU failed (CUDA error {err})")
        if w["shard"] is not None:
            self._copy_shard(full, dst, spec.shape, w["shard"], STORAGE_BYTES[spec.storage])
            full.free()

    def _copy_shard(self, src, dst, shape, shard: dict, elem: int) -> None:
        """The shard's ranges of a full device tensor into a dense rank tensor (one 2-D copy per
        range: rows = the axes before it, a row's bytes = the range times the axes after it)."""
        axis = shard["axis"]
        outer = int(np.prod(shape[:axis], dtype=np.int64))
        inner = int(np.prod(shape[axis + 1:], dtype=np.int64)) * elem
        size = sum(b - a for a, b in shard["ranges"])
        done = 0
        for a, b in shard["ranges"]:
            copy = self.cuda.Memcpy2D()
            copy.set_src_device(src)
            copy.src_x_in_bytes, copy.src_pitch = a * inner, shape[axis] * inner
            copy.set_dst_device(dst)
            copy.dst_x_in_bytes, copy.dst_pitch = done * inner, size * inner
            copy.width_in_bytes, copy.height = (b - a) * inner, max(1, outer)
            copy(aligned=False)      # cuMemcpy2DUnaligned: any pitch
            done += b - a

    def _exchange(self, payload: bytes, width: int) -> list[bytes]:
        out = ctypes.create_string_buffer(width * self.ranks)
        buf = ctypes.create_string_buffer(payload.ljust(width, b"\0"), width)
        if self.lib.kbp_tp_exchange(ctypes.cast(buf, ctypes.c_void_p), ctypes.cast(out, ctypes.c_void_p), width,
                                    self.timeout_ms):
            raise DeviceError(self.lib.kbp_tp_last_error().decode())
        return [out.raw[r * width:(r + 1) * width] for r in range(self.ranks)]

    def step(self, token: int) -> tuple[np.ndarray, int]:
        if self.lib.kbp_step(self.handle, int(token), self.position):
            raise DeviceError(f"decode step failed: {self.lib.kbp_last_error().decode()}")
        if self.lib.kbp_tp_wait(self.stream, self.timeout_ms, b"decode step"):
            raise DeviceError(self.lib.kbp_tp_last_error().decode())
        self.cuda.memcpy_dtoh(self._local, self.lib.kbp_logits(self.handle))
        self.position += 1
        local = bf16_from_bits(self._local)
        value, index = local_argmax(local, self.vocab_slices[self.rank][0])
        pairs = [struct.unpack("<fi", p[:8]) for p in self._exchange(struct.pack("<fi", value, index), 8)]
        width = 2 * max(c for _, c in self.vocab_slices)
        parts = self._exchange(self._local.tobytes(), width)
        logits = np.concatenate([bf16_from_bits(np.frombuffer(p[:2 * c], np.uint16))
                                 for p, (_, c) in zip(parts, self.vocab_slices)])
        return logits, combine_argmax(pairs)

    def step_alone(self, token: int, others: list[dict[int, np.ndarray]]) -> tuple[np.ndarray, list[np.ndarray]]:
        """One step of this rank alone (loopback): `others[i][r]` is rank r's BF16 partial (bits)
        at post-mix site i, written into the region before the step. Returns this rank's logits
        slice and its own partial at every site (BF16 bits)."""
        for site, parts in zip(self.sites, others):
            for r, bits in parts.items():
                if r != self.rank:
                    self.cuda.memcpy_htod(int(self.region) + site["offset"] + r * site["slot_bytes"],
                                          np.ascontiguousarray(bits, np.uint16))
        if self.lib.kbp_step(self.handle, int(token), self.position) or self.lib.kbp_sync(self.handle):
            raise DeviceError(f"decode step failed: {self.lib.kbp_last_error().decode()}")
        self.position += 1
        self.cuda.memcpy_dtoh(self._local, self.lib.kbp_logits(self.handle))
        own = []
        for site, parts in zip(self.sites, others):
            out = np.empty_like(np.asarray(next(iter(parts.values())), np.uint16))
            self.cuda.memcpy_dtoh(out, int(self.region) + site["offset"] + self.rank * site["slot_bytes"])
            own.append(out)
        return bf16_from_bits(self._local), own

    def close(self) -> None:
        if getattr(self, "handle", None):
            self.lib.kbp_destroy(self.handle)
            self.handle = None
        self.lib.kbp_tp_finalize()
        if self.region is not None:
            self.region.free()
            self.region = None
