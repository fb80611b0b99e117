"""Mapping tables: how a checkpoint family's tensors become a blueprint's weights.

One table per architecture family (`kbpc/weights/glm5_next.py`, ...), one `MappingRule` per
blueprint node that reads weights: which checkpoint tensors it takes (paths with `{model}`,
`{layer}`, `{e}` and `{lm_head}` filled per node) and which transform turns them into the node's
weight specs (`kbpc/weights/transforms.py`). Conversion runs in two passes: every rule first
lists the tensors it needs with their dtypes and shapes (`Need`), and all of them are checked
before any tensor is read, so a bad checkpoint is refused with nothing loaded; then the nodes are
converted one at a time (`convert_nodes` is a generator), so a model streams node by node."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import numpy as np

from kbpc.errors import WeightsError
from kbpc.ir.graph import Blueprint
from kbpc.ir.records import Node
from kbpc.ir.weights import WeightSpec, node_weight_specs
from kbpc.weights import STORAGE_DTYPES
from kbpc.weights.checkpoint import check_finite
from kbpc.weights.hf_config import HfModel
from kbpc.weights.hf_folder import HfFolder


@dataclass(frozen=True)
class MappingRule:
    """One blueprint node (by block type and name inside its block, `l3.dsa.q_b` -> ("dsa",
    "q_b")) and how its weights come from the checkpoint."""
    block: str
    node: str
    transform: str                 # a key of kbpc.weights.transforms.TRANSFORMS
    sources: tuple[str, ...]       # checkpoint paths; a param transform uses "suffix=path"
    convention: str = ""           # the CONVENTIONS entry (kbpc/ir/config.py) the rule applies


@dataclass(frozen=True)
class Need:
    """A checkpoint tensor a rule reads, with what it must look like."""
    tensor: str
    dtypes: tuple[str, ...]
    shape: tuple[int, ...]
    what: str                      # e.g. "NVFP4 codes for node l0.kda.q"


@dataclass(frozen=True)
class Family:
    """A checkpoint family: its config reading (kbpc/weights/hf_config.py) and its mapping table."""
    engine: str                                   # the blueprint engine it serves (ModelConfig.engine)
    prefixes: tuple[str, ...]                     # where the text model's modules live, tried in order
    rules: tuple[MappingRule, ...]
    ignored: tuple[str, ...] = ()                 # regexes of checkpoint tensors no blueprint reads
    read_config: Callable[[dict, str], HfModel] | None = field(default=None, compare=False)

    def rule_for(self, node: Node) -> MappingRule | None:
        name = node_name(node)
        for rule in self.rules:
            if rule.block == node.block_type and rule.node == name:
                return rule
        return None


def node_name(node: Node) -> str:
    """The node's name inside its block: `l3.dsa.q_b` -> `q_b`, `head.lm_head` -> `lm_head`."""
    return node.id[len(node.block) + 1:] if node.id.startswith(node.block + ".") else node.id


@dataclass
class Job:
    """One node to convert: its rule, its specs and the checkpoint paths filled in for it."""
    node: Node
    rule: MappingRule
    specs: list[WeightSpec]
    paths: dict[str, str]          # format fields for rule.sources


class Transform(Protocol):
    def needs(self, ctx: "Context", job: Job) -> list[Need]: ...

    def apply(self, ctx: "Context", job: Job) -> dict[str, np.ndarray]: ...


@dataclass
class Context:
    """What every transform sees: the blueprint, the opened folder, the family's config record."""
    bp: Blueprint
    folder: HfFolder
    family: Family
    hf: HfModel                    # what the family read from config.json
    prefix: str                    # where the text model lives, e.g. "model.language_model"

    def read(self, name: str) -> np.ndarray:
        return self.folder.read(name)


def source(job: Job, template: str, **extra: object) -> str:
    try:
        return template.format(**job.paths, **extra)
    except (KeyError, IndexError) as exc:
        raise WeightsError(f"mapping rule source {template!r} uses an unknown field {exc}",
                           f"node {job.node.id}") from None


def plan(ctx: Context, transforms: dict[str, Transform]) -> list[Job]:
    """A job for every node with weight specs; all needs checked before anything is read."""
    jobs = []
    for node in ctx.bp.nodes():
        specs = node_weight_specs(ctx.bp, node)
        if not specs:
            continue
        rule = ctx.family.rule_for(node)
        if rule is None:
            raise WeightsError(f"the {ctx.family.engine} mapping table has no rule for node {node.id} "
                               f"(op {node.op}, block type {node.block_type})", ctx.bp.meta.source)
        paths = {"model": ctx.prefix, "lm_head": _lm_head(ctx),
                 "layer": f"{ctx.prefix}.layers.{node.layer}" if node.layer is not None else ctx.prefix}
        jobs.append(Job(node, rule, specs, paths))
    needed = set()
    for job in jobs:
        for need in transforms[job.rule.transform].needs(ctx, job):
            check_need(ctx, need)
            needed.add(need.tensor)
    _check_unused(ctx, needed)
    return jobs


def _lm_head(ctx: Context) -> str:
    """The LM head's module: its own, or the embedding when the checkpoint ties them."""
    return f"{ctx.prefix}.embed_tokens" if ctx.hf.tied_embeddings else "lm_head"


def check_need(ctx: Context, need: Need) -> None:
    folder = ctx.folder
    if need.tensor not in folder.tensors:
        raise WeightsError(f"tensor {need.tensor!r} is missing ({need.what}); the checkpoint has "
                           f"{len(folder.tensors)} tensors in {len(folder.shards)} file(s)", str(folder.path))
    info = folder.info(need.tensor)
    if info.dtype not in need.dtypes:
        raise WeightsError(f"dtype {info.dtype}, expected {' or '.join(need.dtypes)} ({need.what})",
                           folder.where(need.tensor))
    if tuple(info.shape) != tuple(need.shape):
        raise WeightsError(f"shape {list(info.shape)}, expected {list(need.shape)} ({need.what})",
                           folder.where(need.tensor))


def _check_unused(ctx: Context, needed: set[str]) -> None:
    """Every checkpoint tensor is read by some rule or ignored by the family on purpose: a tensor
    nobody reads means a model variant the table does not know (a bias, an extra norm)."""
    ignored = [re.compile(p) for p in ctx.family.ignored]
    # layers past the blueprint's (a multi-token-prediction head stored as layers.N) are no part
    # of a decode step; check_layers has already matched num_hidden_layers to the blueprint
    extra = re.compile(rf"^{re.escape(ctx.prefix)}\.layers\.(\d+)\.")
    for name in sorted(ctx.folder.tensors):
        beyond = (m := extra.match(name)) is not None and int(m[1]) >= len(ctx.bp.layers)
        if name not in needed and not beyond and not any(p.search(name) for p in ignored):
            raise WeightsError("no mapping rule reads this tensor (a model variant the "
                               f"{ctx.family.engine} table does not know?)", ctx.folder.where(name))


def convert_nodes(ctx: Context, jobs: list[Job], transforms: dict[str, Transform]
                  ) -> Iterator[tuple[WeightSpec, np.ndarray]]:
    """Each spec with its converted array (stored form), node by node."""
    for job in jobs:
        out = transforms[job.rule.transform].apply(ctx, job)
        for spec in job.specs:
            suffix = spec.name[len(job.node.id) + 1:]
            if suffix not in out:
                raise WeightsError(f"transform {job.rule.transform!r} produced no {suffix!r}", f"node {job.node.id}")
            arr = np.asarray(out[suffix], order="C")
            if arr.dtype != np.dtype(STORAGE_DTYPES[spec.storage]) or arr.shape != tuple(spec.shape):
                raise WeightsError(f"converted {spec.name} is {arr.dtype} {list(arr.shape)}, the blueprint "
                                   f"needs {spec.storage} {list(spec.shape)}", f"node {job.node.id}")
            check_finite(spec, arr, f"{ctx.folder.path}: {spec.name} (converted)")
            yield spec, arr
