"""A Hugging Face checkpoint folder as a blueprint's weights.

    bp, ckpt = bind(bp, folder)          # config.json -> model config, checked against the blueprint
    for spec, array in ckpt.convert():   # node by node, in kbpc's stored forms
        ...

`bind` reads config.json with the blueprint engine's family (one mapping table per family, see
FAMILIES), checks the layer sequence and sizes against the blueprint (errors name the config.json
field), and rebuilds the blueprint with the checkpoint's model constants (CONVENTIONS in
kbpc/ir/config.py). Nothing is read from the shards until every tensor the mapping needs has
been checked for presence, dtype and shape."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from kbpc.errors import WeightsError
from kbpc.frontend.load import blueprint_from_doc
from kbpc.ir.graph import Blueprint
from kbpc.ir.weights import WeightSpec
from kbpc.weights.glm5_next import GLM5_NEXT
from kbpc.weights.hf_config import HfModel, check_layers, check_symbols
from kbpc.weights.hf_folder import HfFolder, is_hf_folder
from kbpc.weights.mapping import Context, Family, Job, convert_nodes, plan
from kbpc.weights.transforms import TRANSFORMS

FAMILIES: dict[str, Family] = {GLM5_NEXT.engine: GLM5_NEXT}

__all__ = ["BoundCheckpoint", "bind", "is_hf_folder", "load_hf_weights", "check_config"]


@dataclass
class BoundCheckpoint:
    """A checkpoint folder checked against one blueprint, ready to convert."""
    bp: Blueprint
    folder: HfFolder
    hf: HfModel
    family: Family
    jobs: list[Job]
    ctx: Context

    def convert(self) -> Iterator[tuple[WeightSpec, np.ndarray]]:
        return convert_nodes(self.ctx, self.jobs, TRANSFORMS)

    def weights(self) -> dict[str, np.ndarray]:
        return {spec.name: arr for spec, arr in self.convert()}


def family_of(bp: Blueprint) -> Family:
    family = FAMILIES.get(bp.config.engine)
    if family is None:
        raise WeightsError(f"no checkpoint mapping table for engine {bp.config.engine!r}; known: "
                           f"{', '.join(FAMILIES)}", bp.meta.source)
    return family


def read_model(bp: Blueprint, folder: HfFolder) -> tuple[Family, HfModel]:
    family = family_of(bp)
    return family, family.read_config(folder.config, str(folder.path / "config.json"))


def bind(bp: Blueprint, path: Path, config_path: Path | None = None) -> tuple[Blueprint, BoundCheckpoint]:
    """The blueprint rebuilt with the checkpoint's model config (a --config file still wins),
    and the checkpoint checked against it."""
    folder = HfFolder(path)
    family, hf = read_model(bp, folder)
    check_layers(bp, hf)
    check_symbols(bp, hf)
    bound = blueprint_from_doc(bp.raw, bp.meta.source, config_path, hf.checkpoint_config())
    return bound, _plan(bound, folder, family, hf)


def _plan(bp: Blueprint, folder: HfFolder, family: Family, hf: HfModel) -> BoundCheckpoint:
    prefix = next((p for p in family.prefixes if f"{p}.embed_tokens.weight" in folder.tensors), None)
    if prefix is None:
        raise WeightsError(f"no embedding table under {' or '.join(p + '.embed_tokens.weight' for p in family.prefixes)}"
                           f": not a {family.engine} text model checkpoint", str(folder.path))
    ctx = Context(bp=bp, folder=folder, family=family, hf=hf, prefix=prefix)
    return BoundCheckpoint(bp, folder, hf, family, plan(ctx, TRANSFORMS), ctx)


def check_config(bp: Blueprint, path: Path) -> BoundCheckpoint:
    """For a blueprint whose model config is already fixed (a compiled bundle's): the checkpoint's
    config.json must give the same symbols and constants."""
    folder = HfFolder(path)
    family, hf = read_model(bp, folder)
    check_layers(bp, hf)
    check_symbols(bp, hf)
    want = dataclasses.asdict(bp.config.constants)
    for name, value in sorted(hf.constants.items()):
        if want.get(name) != value:
            raise WeightsError(f"the model was built with {name} = {want.get(name)!r}, this checkpoint's "
                               f"{hf.fields[name]} gives {value!r} (compile or run it with --weights {path} "
                               "so that its config.json sets the model config)", hf.source)
    for name, value in sorted(hf.symbols.items()):
        if bp.symbols.get(name, value) != value:
            raise WeightsError(f"the model has {name} = {bp.symbols[name]}, this checkpoint's {hf.fields[name]} "
                               f"gives {value}", hf.source)
    return _plan(bp, folder, family, hf)


def load_hf_weights(bp: Blueprint, path: Path) -> dict[str, np.ndarray]:
    """Converted weights for a blueprint already bound to this checkpoint (see `bind`)."""
    return check_config(bp, path).weights()
