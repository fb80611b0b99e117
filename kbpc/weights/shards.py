"""A tensor-parallel rank's part of a checkpoint: each tensor checked (presence, dtype, full shape)
and sliced through its memory map before anything is read, so a rank reads only its ranges
(kbpc/ir/parallel.py, Shard)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from kbpc.errors import WeightsError
from kbpc.ir.parallel import Shard
from kbpc.ir.weights import WeightSpec
from kbpc.weights.checkpoint import _ST, check_finite, open_checkpoint


def checkpoint_shards(source: Path, parts: list[tuple[WeightSpec, Shard | None]]) -> Iterator[tuple[str, np.ndarray]]:
    """(name, the rank's part) for each (full spec, shard) in order."""
    tensors = open_checkpoint(Path(source))
    for spec, shard in parts:
        where = f"{source}: {spec.name}"
        arr = tensors.get(spec.name)
        if arr is None:
            raise WeightsError("tensor missing from the checkpoint", where)
        if arr.dtype != _ST[spec.storage][2]:
            raise WeightsError(f"dtype {arr.dtype} but the blueprint needs {spec.storage}", where)
        if tuple(arr.shape) != tuple(spec.shape):
            raise WeightsError(f"shape {tuple(arr.shape)} but the blueprint needs {tuple(spec.shape)}", where)
        part = shard.take(arr) if shard is not None else np.array(arr)   # 0-d stays 0-d
        check_finite(spec, part, where)
        yield spec.name, part
