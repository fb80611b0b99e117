"""`kbpc compile`: blueprint -> passes -> code generation -> nvcc -> signed .kbp bundle.

Members of the bundle: graph.json (the blueprint as compiled, byte for byte), plan.json (the
lowered plan, canonical JSON), src/ (generated sources and the kernels/ and runtime_stub/ files
they include, for audit and rebuild), lib/rank0/libkbp.so, and weights/ for a full bundle. The
manifest records the blueprint, plan digest, target, tensor-parallel size, model config, weight
specs, the expected checkpoint (lite) and the toolchain."""
from __future__ import annotations

import dataclasses
import hashlib
import re
import shlex
from typing import Callable
from dataclasses import dataclass
from pathlib import Path

from kbpc import __version__
from kbpc.bundle.container import Member, write_bundle
from kbpc.bundle.keys import Keyring, Signer
from kbpc.bundle.keystore import signing_key
from kbpc.bundle.manifest import canonical_json
from kbpc.codegen.emit import Sources, build_step, generate
from kbpc.codegen.records import Launch, profile_marks
from kbpc.errors import KbpcError
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options, Plan
from kbpc.ir.weights import weight_specs
from kbpc.passes import run_pipeline
from kbpc.report.fusion import FusionReport, fusion_report
from kbpc.report.parallel import lib_path, tp_summary
from kbpc.passes.split_tensor_parallel import rank_plan
from kbpc.targets import get_target
from kbpc.toolchain.assets import KERNELS_DIR, RUNTIME_STUB_DIR, sources_digest
from kbpc.toolchain.cache import ObjectCache, default_object_dir, run_bundle_dir
from kbpc.toolchain.library import BuildEvents, BuildResult, build_library
from kbpc.toolchain.workdir import build_folder, sweep
from kbpc.util.atomic import check_writable_dir
from kbpc.util.hashing import sha256_file
from kbpc.util.jsonload import read_regular_file
from kbpc.weights.binding import check_covers, checkpoint_files
from kbpc.weights.convert import converted_config
from kbpc.weights.hf_checkpoint import bind, is_hf_folder

LIB_PATH = lib_path(0)


@dataclass(frozen=True)
class CompileRequest:
    blueprint: Path
    output: Path
    options: Options
    signer: Signer | Callable[[], Signer]   # a function: creates the key once the input is checked
    config: Path | None = None
    cache_dir: Path | None = None
    jobs: int | None = None
    weights: Path | None = None      # a checkpoint to embed (full) or name by hashes (lite)
    embed_weights: bool = False
    verify: bool = False
    dump_dir: Path | None = None
    stamps: bool = False             # a profiling build: in-kernel phase stamps (kernels/kbp_stamps.cuh)


@dataclass(frozen=True)
class CompileResult:
    manifest: dict
    plan: Plan
    build: BuildResult
    fusion: FusionReport
    key_ids: tuple[str, ...]


def compile_bundle(req: CompileRequest, events: BuildEvents = BuildEvents()) -> CompileResult:
    on_stage = events.stage
    _check_folders(req)
    cache = ObjectCache(req.cache_dir)
    on_stage("front end")
    config = req.config or converted_config(req.weights)   # `kbpc convert` output carries its model config
    bp = load_blueprint(req.blueprint, config)
    if req.weights is not None and is_hf_folder(req.weights):
        if req.embed_weights:
            raise KbpcError("a Hugging Face checkpoint folder is converted, not embedded: run kbpc convert "
                            "first and embed its output", str(req.weights))
        bp, _ = bind(bp, Path(req.weights), config)   # its config.json sets the model config
    elif req.weights is not None:   # before the build, not after it: headers only
        check_covers(Path(req.weights), weight_specs(bp))
    on_stage("passes")
    plan = run_pipeline(bp, req.options, verify=req.verify, dump_dir=req.dump_dir)
    signer = req.signer if isinstance(req.signer, Signer) else req.signer()
    on_stage("code generation")
    command = (f"kbpc compile {shlex.quote(req.blueprint.name)} --target {req.options.target} "
               f"--max-context {req.options.max_context}")
    ranks = rank_plans(plan)
    if req.stamps:
        command += " --stamps"
    rank_sources = [generate(rp, command + (f" --tp {req.options.tp} (rank {rp.shard.rank})" if rp.shard else ""),
                             stamps=req.stamps) for rp in ranks]
    sources = rank_sources[0]
    fusion = _fusion_report(bp, req.options, ranks[0], sources)
    if req.dump_dir is not None:
        for r, src in enumerate(rank_sources):
            for rel, text in src.files.items():
                path = Path(req.dump_dir) / _rank_src(rel, r, len(ranks))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    on_stage("nvcc")
    target = get_target(req.options.target)
    sweep(cache.temp)      # what compiles killed earlier left behind
    sweep(cache.objects)
    with build_folder(cache.temp) as work:
        libs = []
        for r, src in enumerate(rank_sources):
            rank_work = work / f"rank{r}"
            rank_work.mkdir()
            build = build_library(src.files, target, rank_work, cache, jobs=req.jobs, events=events,
                                  tensor_parallel=len(ranks) > 1)
            libs.append(build.library)
        on_stage("bundle")
        members = _members(req, bp.raw, plan, rank_sources, libs)
        manifest = _manifest(req, plan, sources, build, fusion)
        if plan.parallel is not None:
            manifest["tp"] = tp_summary(plan, sources.step.comm_bytes // plan.options.tp, sources.step.collective_layout)
            manifest["library"] = manifest["tp"]["library"]
        final = write_bundle(req.output, manifest, members, signer)
    cache.trim()
    return CompileResult(manifest=final, plan=plan, build=dataclasses.replace(build, library=req.output),
                         fusion=fusion, key_ids=tuple(signer.key_ids))


def _check_folders(req: CompileRequest) -> None:
    """Every folder the compile writes to, checked before any work: a read-only output folder
    fails now, not after the whole build."""
    check_writable_dir(Path(req.output).parent, "output folder")
    check_writable_dir(Path(req.cache_dir) if req.cache_dir else default_object_dir(), "cache folder")
    if req.dump_dir is not None:
        check_writable_dir(Path(req.dump_dir), "--dump-dir folder")


def rank_plans(plan: Plan) -> list[Plan]:
    """The plans whose libraries the bundle holds: the plan itself, or one per rank."""
    if plan.parallel is None:
        return [plan]
    return [rank_plan(plan, r) for r in range(plan.parallel.ranks)]


def _rank_src(rel: str, rank: int, ranks: int) -> str:
    """src/step.cu for one rank; src/rank{r}/step.cu for the ranks of a split bundle."""
    return rel if ranks == 1 else rel.replace("src/", f"src/rank{rank}/", 1)


def _fusion_report(bp, options: Options, plan: Plan, sources: Sources) -> FusionReport:
    """Launches with and without the fusion pass (the unfused plan is lowered, not rendered);
    for a split plan, rank 0's."""
    after = sum(len(g.launches) for g in sources.step.groups)
    before = after
    if options.fuse:
        unfused = run_pipeline(bp, dataclasses.replace(options, fuse=False))
        before = sum(len(g.launches) for g in build_step(rank_plans(unfused)[0], "").groups)
    return fusion_report(plan.fusions, before, after)


def _members(req: CompileRequest, raw: dict, plan: Plan, rank_sources: list[Sources],
             libs: list[Path]) -> list[Member]:
    members = [Member("graph.json", data=Path(req.blueprint).read_bytes()),
               Member("plan.json", data=canonical_json(plan.to_json()))]
    members += [Member(lib_path(r), data=lib.read_bytes()) for r, lib in enumerate(libs)]
    headers: set[str] = set()
    for r, sources in enumerate(rank_sources):
        members += [Member(_rank_src(rel, r, len(libs)), data=text.encode())
                    for rel, text in sorted(sources.files.items())]
        headers |= {"kbp_common.cuh"} | _includes(sources)
    for header in sorted(headers):
        members.append(Member(f"src/include/{header}", data=(KERNELS_DIR / header).read_bytes()))
    for stub in sorted(RUNTIME_STUB_DIR.iterdir()):
        if stub.is_file():
            members.append(Member(f"src/runtime_stub/{stub.name}", data=stub.read_bytes()))
    if req.weights is not None and req.embed_weights:
        for path in checkpoint_files(req.weights):
            members.append(Member(f"weights/{path.name}", source=path))
    return members


def _includes(sources: Sources) -> set[str]:
    """Every kernels/ header the generated sources include, directly or through another header, so
    the bundle's src/ rebuilds on its own (glm_mhc_boundary.cuh -> glm_mhc.cuh -> glm_moe_combine.cuh)."""
    pending = list(sources.step.headers)
    for text in sources.files.values():
        pending += _quoted_includes(text)
    found: set[str] = set()
    while pending:
        header = pending.pop()
        if header in found or not (KERNELS_DIR / header).is_file():
            continue
        found.add(header)
        pending += _quoted_includes((KERNELS_DIR / header).read_text())
    return found


def _quoted_includes(text: str) -> list[str]:
    return [line.split('"')[1] for line in text.splitlines() if line.startswith('#include "')]


def _manifest(req: CompileRequest, plan: Plan, sources: Sources, build: BuildResult,
              fusion: FusionReport) -> dict:
    bp = plan.blueprint
    step = sources.step
    manifest = {
        "kind": "full" if req.weights is not None and req.embed_weights else "lite",
        "blueprint_id": bp.meta.blueprint_id, "lineage": bp.meta.lineage, "revision": bp.meta.revision,
        "plan_digest": plan.digest, "target": req.options.target, "tp_size": req.options.tp,
        "options": dataclasses.asdict(req.options),
        "model_config": bp.config.to_json(), "symbols": bp.symbols,
        "step": {"arena_bytes": step.arena_bytes, "streams": step.streams, "events": step.events,
                 "launches": sum(len(g.launches) for g in step.groups), "groups": len(step.groups),
                 "priority_launches": sum(1 for g in step.groups for l in g.launches
                                          if isinstance(l, Launch) and l.priority),
                 "kernel_instances": len(step.instances), "vocab": step.vocab,
                 "critical_path_us": plan.critical_path_us, "serial_us": plan.serial_us,
                 "fusion": fusion.to_json(),
                 "marks": [m.to_json() for m in profile_marks(step.groups)]},
        "state": [{"name": s.name, "bytes": s.nbytes, "shape": list(s.shape), "storage": s.storage}
                  for s in plan.state],
        "weights": [{"name": w.name, "storage": w.storage, "shape": list(w.shape), "bytes": w.nbytes,
                     "experts": w.experts} for w in plan.weights],
        "toolchain": {"kbpc": __version__, "nvcc": build.nvcc, "flags": list(build.flags)},
        "library": {"rank0": LIB_PATH},
    }
    if step.stamps:   # a profiling build: kbp_stamp_logs lists these instances' logs in this order
        manifest["step"]["stamps"] = [inst.name for inst in step.instances]
    if req.weights is not None:
        files = checkpoint_files(req.weights)   # (checked before the build: check_covers or bind)
        manifest["checkpoint"] = [{"name": f.name, "bytes": f.stat().st_size, "sha256": sha256_file(f)}
                                  for f in files]
    return manifest


def compile_for_run(blueprint: Path, config: Path | None, context: int, target: str,
                    weights: str | None = None, numerics: str = "fast",
                    act_quant: bool = True) -> tuple[Path, Keyring]:
    """`kbpc run BLUEPRINT.json` on a GPU: compile for that GPU's `target` into the run cache,
    signed with the local default key, and return the bundle and the keyring that trusts it. The
    bundle is reused while the blueprint, config, context, target, signing key and kbpc's own
    sources (kernels, runtime stub, templates, code generation) are unchanged. A Hugging Face
    checkpoint folder as `weights` sets the model config (its config.json is part of the key).
    act_quant=False builds the debugging variant without activation quantization."""
    from kbpc.errors import BlueprintError, ConfigError
    from kbpc.frontend.load import MAX_BLUEPRINT_BYTES
    from kbpc.ir.config import MAX_CONFIG_BYTES

    load_blueprint(blueprint, config)          # refuse bad input before a key is ever created
    signer = signing_key(None, True, _warn)
    signer = signer if isinstance(signer, Signer) else signer()
    checkpoint = Path(weights) if weights and is_hf_folder(Path(weights)) else None
    digest = hashlib.sha256()
    for part in (read_regular_file(blueprint, MAX_BLUEPRINT_BYTES, BlueprintError, "blueprint file"),
                 read_regular_file(config, MAX_CONFIG_BYTES, ConfigError, "config file") if config else b"",
                 str(context).encode(), target.encode(), numerics.encode(), b"" if act_quant else b"no-act-quant",
                 " ".join(signer.key_ids).encode(),
                 sources_digest().encode(), __version__.encode(),
                 read_regular_file(checkpoint / "config.json", MAX_CONFIG_BYTES, ConfigError, "config file")
                 if checkpoint else b""):
        digest.update(hashlib.sha256(part).digest())
    stem = re.sub(r"[^A-Za-z0-9_.+-]", "_", Path(blueprint).stem)[:64]
    out = run_bundle_dir() / f"{stem}-{target}-{digest.hexdigest()[:16]}.kbp"
    if not out.exists():
        compile_bundle(CompileRequest(blueprint=Path(blueprint), output=out,
                                      options=Options(target=target, max_context=max(context, 16),
                                                      numerics=numerics, act_quant=act_quant),
                                      signer=signer, config=config, weights=checkpoint))
    return out, signer.keyring()


def _warn(note: str) -> None:
    import warnings

    from kbpc.errors import KbpcWarning
    warnings.warn(KbpcWarning(note), stacklevel=3)
