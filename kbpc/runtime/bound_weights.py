"""Weights for a bundle, from where `--weights` says, checked against what the bundle binds:

    (not given)        a full bundle's embedded weights (weights/ members), else synthetic:0
    embedded           the full bundle's embedded weights
    synthetic:SEED     generated (the backends do it themselves)
    FILE or FOLDER     a safetensors checkpoint in kbpc's names; a bundle that records a checkpoint
                       accepts only those files (name, size, SHA-256), streamed once each
    HF FOLDER          a Hugging Face checkpoint folder, converted as it loads; its files are hashed
                       against the bundle's record first (a second read: convert it once with
                       `kbpc convert` to stream with a single read)

Every check happens while the weights load, before any step runs."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from kbpc.errors import WeightsError
from kbpc.ir.weights import WeightSpec
from kbpc.runtime.bundle_model import BundleModel
from kbpc.util.hashing import sha256_file
from kbpc.weights.binding import (CheckpointFile, ChecksumMismatch, Sink, checkpoint_files, file_chunks,
                                  stream_bound)
from kbpc.weights.checkpoint import STORAGE_DTYPE, check_finite
from kbpc.weights.hf_checkpoint import is_hf_folder

EMBEDDED = "embedded"
SYNTHETIC_DEFAULT = "synthetic:0"


def resolve_source(model: BundleModel, given: str | None) -> str:
    """What `--weights` means for this bundle (see the module docstring)."""
    if given is None:
        return EMBEDDED if model.run.kind == "full" else SYNTHETIC_DEFAULT
    if given == EMBEDDED and model.run.kind != "full":
        raise WeightsError("this is a lite bundle: it embeds no weights (pass --weights CHECKPOINT)", "--weights")
    return given


def _streams(model: BundleModel, source: str) -> list[tuple[CheckpointFile | None, str, Iterable[bytes]]]:
    records = {f.name: f for f in model.run.checkpoint or ()}
    if source == EMBEDDED:
        return [(rec, f"{model.bundle.path}:weights/{name}", model.bundle.iter_member(f"weights/{name}"))
                for name, rec in sorted(records.items())]
    files = {p.name: p for p in checkpoint_files(Path(source))}
    if not records:                       # the bundle binds no checkpoint: any will do
        return [(None, str(p), file_chunks(p)) for _, p in sorted(files.items())]
    missing = sorted(set(records) - set(files))
    if missing:
        raise ChecksumMismatch(f"the bundle binds checkpoint files {', '.join(sorted(records))}; not here: "
                               f"{', '.join(missing)}", source)
    return [(rec, str(files[name]), file_chunks(files[name])) for name, rec in sorted(records.items())]


def stream_weights(model: BundleModel, source: str, specs: list[WeightSpec], sink: Sink) -> None:
    """Stream a safetensors checkpoint (or the embedded one) into `sink`, checking the binding."""
    stream_bound(_streams(model, source), specs, sink)


def check_hf_folder(model: BundleModel, folder: Path) -> None:
    """A Hugging Face folder against the files the bundle binds (each hashed in full)."""
    for rec in model.run.checkpoint or ():
        path = Path(folder) / rec.name
        if not path.is_file():
            raise ChecksumMismatch(f"the bundle binds checkpoint file {rec.name}, which is not here", str(folder))
        if path.stat().st_size != rec.bytes or sha256_file(path) != rec.sha256:
            raise ChecksumMismatch("this is not the checkpoint file the bundle was compiled for", str(path))


def host_weights(model: BundleModel, source: str, specs: list[WeightSpec]) -> dict[str, np.ndarray]:
    """The weights as host arrays (the reference backend), from a checkpoint or the bundle."""
    raw = {s.name: np.empty(s.nbytes, np.uint8) for s in specs}

    def sink(spec: WeightSpec, offset: int, view: memoryview) -> None:
        raw[spec.name][offset:offset + len(view)] = np.frombuffer(view, np.uint8)

    stream_weights(model, source, specs, sink)
    out = {}
    for spec in specs:
        out[spec.name] = raw[spec.name].view(STORAGE_DTYPE[spec.storage]).reshape(spec.shape)
        check_finite(spec, out[spec.name], f"{source}: {spec.name}")
    return out


def is_checkpoint_folder(source: str) -> bool:
    return source not in (EMBEDDED,) and not source.startswith("synthetic:") and is_hf_folder(Path(source))
