"""`kbpc shrink SEED --like config.json`: the seed's architecture at a checkpoint's sizes and layer
sequence. The checkpoint family of the seed's engine reads config.json (kbpc/weights/), its
symbols become `--set` values and its layer sequence picks seed layers of the same block types,
in order (each config layer takes the next seed layer with its blocks)."""
from __future__ import annotations

from pathlib import Path

from kbpc.errors import ConfigError
from kbpc.ir.graph import Blueprint
from kbpc.weights.hf_checkpoint import family_of
from kbpc.weights.hf_config import HfModel
from kbpc.weights.hf_folder import read_json_file


def read_like(bp: Blueprint, path: Path) -> HfModel:
    doc = read_json_file(Path(path), "config.json")
    if not isinstance(doc, dict):
        raise ConfigError("expected a JSON object", str(path))
    return family_of(bp).read_config(doc, str(path))


def like_layers(bp: Blueprint, hf: HfModel) -> list[int]:
    """Seed layer indices, increasing, whose block types follow the config's layer sequence."""
    blocks = [tuple(b.rsplit(".", 1)[-1] for b in layer.blocks) for layer in bp.layers]
    chosen: list[int] = []
    for i, want in enumerate(hf.layers):
        start = chosen[-1] + 1 if chosen else 0
        found = next((j for j in range(start, len(blocks)) if blocks[j] == want), None)
        if found is None:
            kinds = sorted({"+".join(b) for b in blocks})
            raise ConfigError(f"layer {i} is {'+'.join(want)}, and the seed has no such layer after layer "
                              f"{start - 1} (its layers are {', '.join(kinds)}; {len(bp.layers)} in all)",
                              f"{hf.source}: {' / '.join(hf.layer_fields)}")
        chosen.append(found)
    return chosen


def like_symbols(bp: Blueprint, hf: HfModel) -> dict[str, int]:
    """The config's symbols that the seed has (the others size nothing in it)."""
    return {k: v for k, v in hf.symbols.items() if k in bp.symbols}
