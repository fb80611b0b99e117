"""`kbpc convert DIR -o OUT --blueprint BP`: a Hugging Face checkpoint folder converted once into
the blueprint's own weights, for runs that should not repeat a costly conversion (MLA absorption
and re-quantization, expert stacking).

OUT is a new folder holding
    kbpc-weights-NNNNN.safetensors   the blueprint's tensors in kbpc's names (shards of at most
                                     --shard-mb MB, node by node, never the whole model in memory)
    model-config.json                the model config the checkpoint's config.json gives, in the
                                     --config file format (used automatically when OUT is --weights)
    kbpc-convert.json                provenance: blueprint id, source files with SHA-256, the
                                     conventions applied, kbpc version
It is written in a temporary folder beside OUT and renamed into place, so a failed conversion
leaves nothing."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

from kbpc import __version__
from kbpc.errors import KbpcError
from kbpc.frontend.load import load_blueprint
from kbpc.ir.config import CONVENTIONS
from kbpc.weights.checkpoint import write_checkpoint
from kbpc.weights.hf_checkpoint import bind

RECORD = "kbpc-convert.json"
MODEL_CONFIG = "model-config.json"


def converted_config(weights: str | Path | None) -> Path | None:
    """The model config a converted folder carries (None for anything else)."""
    if weights is None:
        return None
    path = Path(weights)
    return path / MODEL_CONFIG if (path / RECORD).is_file() and (path / MODEL_CONFIG).is_file() else None


def convert(blueprint: Path, source: Path, out: Path, config_path: Path | None = None,
            shard_bytes: int = 2 << 30) -> dict:
    """Convert and write; returns the provenance record."""
    out = Path(out)
    if out.exists():
        raise KbpcError("already exists; choose a new output folder", str(out))
    bp = load_blueprint(blueprint, config_path)
    bp, checkpoint = bind(bp, Path(source), config_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        shards = _write_shards(tmp, checkpoint.convert(), shard_bytes)
        record = _record(bp, checkpoint, blueprint, shards)
        cfg = bp.config
        (tmp / MODEL_CONFIG).write_text(json.dumps({"symbols": dict(cfg.symbols),
                                                    "constants": dataclasses.asdict(cfg.constants)}, indent=1) + "\n")
        (tmp / RECORD).write_text(json.dumps(record, indent=1) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)   # mkdtemp made it private
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def _write_shards(folder: Path, items, shard_bytes: int) -> list[dict]:
    shards: list[dict] = []
    pending: dict = {}
    specs: list = []

    def flush() -> None:
        if specs:
            name = f"kbpc-weights-{len(shards) + 1:05d}.safetensors"
            write_checkpoint(folder / name, pending, specs)
            shards.append({"name": name, "tensors": len(specs), "bytes": sum(s.nbytes for s in specs)})
            pending.clear()
            specs.clear()

    for spec, arr in items:
        if specs and sum(s.nbytes for s in specs) + spec.nbytes > shard_bytes:
            flush()
        pending[spec.name] = arr
        specs.append(spec)
    flush()
    return shards


def _record(bp, checkpoint, blueprint: Path, shards: list[dict]) -> dict:
    return {
        "format": "kbpc-convert/v1", "kbpc": __version__,
        "blueprint": {"file": Path(blueprint).name, "blueprint_id": bp.meta.blueprint_id, "engine": bp.config.engine},
        "source": {"folder": str(checkpoint.folder.path), "files": checkpoint.folder.file_hashes()},
        "model_config": bp.config.to_json(),
        "conventions": [dataclasses.asdict(c) for c in CONVENTIONS.get(bp.config.engine, ())],
        "shards": shards,
    }
