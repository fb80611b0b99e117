"""A Hugging Face checkpoint folder: `config.json`, the quantization config (`hf_quant_config.json`
or config.json's `quantization_config`) and safetensors shards (with `model.safetensors.index.json`
when sharded).

Every shard is first opened with the `safetensors` package, whose parser checks the header, the
offsets and that the data covers the file exactly, so a truncated or malformed file is refused
before anything is read. Each tensor is then memory-mapped on its own (`read`), so a checkpoint is
never held whole in host memory. Nothing here knows a model family: `kbpc/weights/glm5_next.py`
and its kin say what the tensors mean."""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open

from kbpc.errors import WeightsError
from kbpc.util.hashing import sha256_file

MAX_JSON_BYTES = 64 << 20
INDEX_NAME = "model.safetensors.index.json"
QUANT_NAME = "hf_quant_config.json"

# safetensors dtype -> the numpy dtype a tensor is held as (BF16 as raw bits, FP8 as codes)
HELD = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F8_E4M3": np.uint8,
        "U8": np.uint8, "I8": np.int8, "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    path: Path
    dtype: str                   # the safetensors dtype name (BF16, F32, F8_E4M3, U8, ...)
    shape: tuple[int, ...]
    offset: int                  # absolute byte offset of the data in `path`


@dataclass(frozen=True)
class ModuleFormat:
    """How one projection is stored: `algo` is the ModelOpt quant_algo, None when unquantized."""
    algo: str | None
    group_size: int = 0


def read_json_file(path: Path, what: str) -> Any:
    """A bounded JSON file; WeightsError naming the file on any failure."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise WeightsError(f"{what} is larger than {MAX_JSON_BYTES >> 20} MiB", str(path))
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise WeightsError(f"{what} not found", str(path)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightsError(f"{what} is not valid JSON: {exc}", str(path)) from None


def is_hf_folder(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


class HfFolder:
    """An opened checkpoint folder: its config, quantization config and tensor table."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if not is_hf_folder(self.path):
            raise WeightsError("not a Hugging Face checkpoint folder (no config.json)", str(self.path))
        self.config: dict = read_json_file(self.path / "config.json", "config.json")
        if not isinstance(self.config, dict):
            raise WeightsError("config.json must hold a JSON object", str(self.path / "config.json"))
        self.quant = QuantConfig.read(self.path, self.config)
        self.tensors: dict[str, TensorInfo] = {}
        for shard in self.shards:
            for info in _shard_tensors(shard):
                if info.name in self.tensors:
                    raise WeightsError(f"tensor {info.name!r} is also in {self.tensors[info.name].path.name}",
                                       str(shard))
                self.tensors[info.name] = info
        self._check_index()

    @cached_property
    def shards(self) -> list[Path]:
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise WeightsError("no *.safetensors files in this checkpoint folder", str(self.path))
        return files

    def _check_index(self) -> None:
        index_path = self.path / INDEX_NAME
        if not index_path.exists():
            return
        index = read_json_file(index_path, INDEX_NAME)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise WeightsError('expected an object with a "weight_map"', str(index_path))
        for name, file in weight_map.items():
            info = self.tensors.get(name)
            if info is None:
                raise WeightsError(f"the index lists tensor {name!r} in {file!r}, but no shard holds it",
                                   str(index_path))
            if info.path.name != file:
                raise WeightsError(f"the index puts tensor {name!r} in {file!r}, but it is in "
                                   f"{info.path.name}", str(index_path))

    def info(self, name: str) -> TensorInfo:
        return self.tensors[name]

    def where(self, name: str) -> str:
        """`file: tensor` for error messages."""
        info = self.tensors.get(name)
        return f"{info.path if info else self.path}: {name}"

    def read(self, name: str) -> np.ndarray:
        """The tensor memory-mapped, in its held dtype (BF16 as uint16 bits, FP8 as uint8 codes)."""
        info = self.tensors[name]
        held = HELD.get(info.dtype)
        if held is None:
            raise WeightsError(f"dtype {info.dtype} is not supported", self.where(name))
        count = int(np.prod(info.shape, dtype=np.int64))
        if count == 0:
            return np.zeros(info.shape, held)
        return np.memmap(info.path, dtype=held, mode="r", offset=info.offset, shape=(count,)).reshape(info.shape)

    def file_hashes(self) -> list[dict]:
        """name, size and SHA-256 of config files and shards (what a conversion records)."""
        names = ["config.json", QUANT_NAME, INDEX_NAME] + [p.name for p in self.shards]
        out = []
        for name in names:
            path = self.path / name
            if path.exists():
                out.append({"name": name, "bytes": path.stat().st_size, "sha256": sha256_file(path)})
        return out


def _shard_tensors(path: Path) -> list[TensorInfo]:
    """Validate one shard with the safetensors parser, then list its tensors with absolute offsets."""
    try:
        with safe_open(str(path), framework="numpy") as handle:
            names = set(handle.keys())
    except (SafetensorError, OSError) as exc:
        raise WeightsError(f"not a valid safetensors file: {exc}", str(path)) from None
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))     # already validated by safe_open
    out = []
    for name in sorted(names):
        entry = header[name]
        start, _ = entry["data_offsets"]
        out.append(TensorInfo(name, path, entry["dtype"], tuple(entry["shape"]), 8 + size + start))
    return out


class QuantConfig:
    """ModelOpt's quantization record: one algorithm for every projection, or MIXED_PRECISION with
    a `quantized_layers` table; `exclude_modules` patterns stay unquantized."""

    def __init__(self, source: str, algo: str | None, layers: dict[str, ModuleFormat],
                 exclude: tuple[str, ...], group_size: int, kv_cache_algo: str | None):
        self.source, self.algo, self.layers = source, algo, layers
        self.exclude, self.group_size, self.kv_cache_algo = exclude, group_size, kv_cache_algo

    @classmethod
    def read(cls, folder: Path, config: dict) -> "QuantConfig":
        path = folder / QUANT_NAME
        if path.exists():
            doc = read_json_file(path, QUANT_NAME)
            body = doc.get("quantization") if isinstance(doc, dict) else None
            where = str(path)
        else:
            body = config.get("quantization_config")
            where = f"{folder / 'config.json'}: quantization_config"
            if body is None:
                return cls("unquantized", None, {}, (), 0, None)
            if not isinstance(body, dict) or body.get("quant_method") != "modelopt":
                method = body.get("quant_method") if isinstance(body, dict) else body
                raise WeightsError(f"quantization method {method!r} is not a ModelOpt "
                                   "export; kbpc reads ModelOpt NVFP4/FP8 checkpoints", where)
        if not isinstance(body, dict) or not isinstance(body.get("quantized_layers") or {}, dict):
            raise WeightsError("expected a quantization object (with a quantized_layers object)", where)
        layers = {name: ModuleFormat(*_algo(entry, f"quantized_layers[{name!r}]", where))
                  for name, entry in (body.get("quantized_layers") or {}).items()}
        algo, group = _algo(body, "quantization", where)
        exclude = tuple(str(p) for p in body.get("exclude_modules") or body.get("ignore") or ())
        return cls(where, algo, layers, exclude, group, body.get("kv_cache_quant_algo"))

    def format_of(self, module: str) -> ModuleFormat:
        """The format of a projection (a module path); per-expert modules inherit their parent's."""
        parts = module.split(".")
        for end in range(len(parts), 0, -1):
            entry = self.layers.get(".".join(parts[:end]))
            if entry is not None:
                return entry
        if self.algo in (None, "MIXED_PRECISION") or any(fnmatchcase(module, p) for p in self.exclude):
            return ModuleFormat(None)
        return ModuleFormat(self.algo, self.group_size)


def _algo(entry: Any, what: str, where: str) -> tuple[str | None, int]:
    """(quant_algo, group_size) of one quantization entry, checked."""
    if not isinstance(entry, dict):
        raise WeightsError(f"{what} must be an object", where)
    algo, group = entry.get("quant_algo"), entry.get("group_size") or 0
    if (algo is not None and not isinstance(algo, str)) or isinstance(group, bool) or not isinstance(group, int):
        raise WeightsError(f"{what}: quant_algo must be a string and group_size an integer", where)
    return algo, group
