"""The kbpc command line: a thin click group. Commands parse options, call into the package and
print; every failure becomes one line on stderr and a distinct exit code (kbpc/cli_options.py),
and every report is also available as JSON (--json on stdout, --json-out FILE)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from kbpc import __version__
from kbpc.cli_bundle import keygen, sign, verify
from kbpc.cli_cache import cache
from kbpc.cli_options import (CONFIG_OPTION, EXIT_CODES_HELP, TRUST_OPTION, emit_report, json_options,
                              reports_errors)
from kbpc.errors import KbpcError


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, prog_name="kbpc")
def main() -> None:
    """kbpc compiles kbp-graph blueprints (a planned LLM decode step) into signed .kbp GPU bundles.

    \b
    Start with:
      kbpc inspect examples/tiny.graph.json       what is inside, bytes per token, roofline
      kbpc run examples/tiny.graph.json           decode tokens (GPU if present, else reference)
      kbpc shrink BLUEPRINT -o tiny.json          the same architecture at toy sizes
    """


@main.command()
@click.argument("blueprint", type=click.Path(path_type=Path))
@json_options
@click.option("--bandwidth", type=click.FloatRange(min=0, min_open=True), default=4300.0,
              show_default=True, help="Memory bandwidth in GB/s for the bandwidth-floor estimate "
                                      "(4300 = measured H200 copy bandwidth).")
@click.option("--context", type=click.IntRange(min=0), default=None,
              help="Also estimate the bytes a step moves at this context (activations, state, caches).")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="A blueprint: also show its split over this many ranks (bytes per token per rank, "
                   "collectives per step).")
@CONFIG_OPTION
@TRUST_OPTION
@reports_errors
def inspect(blueprint: Path, as_json: bool, json_out: Path | None, bandwidth: float, context: int | None,
            tp: int, config_path: Path | None, trust_paths: tuple[Path, ...]) -> None:
    """Show what a blueprint holds (layers, ops, kernel families and launches, solved symbols,
    weight bytes by format, bytes read per decode token, bandwidth-floor tokens/s), or what a
    .kbp bundle holds (manifest, signer, target, plan digest, the step's launches, streams and
    modelled critical path, the fusion report: rules applied and candidates left apart with the
    reason, member sizes). A bundle by a signer you do not trust is shown under an UNTRUSTED
    warning; nothing in a bundle is loaded."""
    from kbpc.frontend.load import load_blueprint
    from kbpc.report.render import console
    from kbpc.runtime.select import is_bundle

    if is_bundle(blueprint):
        from kbpc.report.inspect_bundle import inspect_bundle, render_bundle_summary

        summary = inspect_bundle(blueprint, trust_paths)
        if not emit_report(summary, as_json, json_out):
            render_bundle_summary(summary, console())
        return
    from kbpc.report.inspect_blueprint import summarize
    from kbpc.report.render import render_blueprint_summary

    bp = load_blueprint(blueprint, config_path)
    summary = summarize(bp, bandwidth, context)
    if tp > 1:
        from kbpc.ir.plan import Options
        from kbpc.passes import run_pipeline
        from kbpc.report.parallel import tp_summary

        summary["tp"] = tp_summary(run_pipeline(bp, Options(tp=tp)))
    if not emit_report(summary, as_json, json_out):
        render_blueprint_summary(summary, console())
        if tp > 1:
            from kbpc.report.parallel import render_tp
            render_tp(summary["tp"], console())


@main.command()
@click.argument("blueprint", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the new blueprint JSON (written atomically).")
@click.option("--set", "assignments", multiple=True, metavar="SYMBOL=VALUE",
              help="Change one symbol, e.g. --set experts=128 (repeatable).")
@click.option("--layers", "layer_pattern", default=None, metavar="PATTERN",
              help="Layers to keep: indices and ranges (0,3-5) or 'per-template' (the first "
                   "layer of each template). Default: all.")
@click.option("--preset", type=click.Choice(["tiny"]), default=None,
              help="Toy sizes for the blueprint's engine family, every template kept once; "
                   "--set and --layers override the preset.")
@click.option("--like", "like_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A checkpoint's config.json: its sizes and layer sequence (seed layers of the same "
                   "kinds, in order); --set overrides its sizes.")
@CONFIG_OPTION
@json_options
@reports_errors
def shrink(blueprint: Path, output: Path, assignments: tuple[str, ...], layer_pattern: str | None,
           preset: str | None, like_path: Path | None, config_path: Path | None, as_json: bool,
           json_out: Path | None) -> None:
    """Write the same architecture at other sizes: a valid blueprint of the same schema with
    nodes, edges, groups, collapsed templates, dims and bytes rewritten consistently."""
    from kbpc.frontend.load import load_blueprint
    from kbpc.tools.shrink import PRESETS, parse_assignments, select_layers
    from kbpc.tools.shrink import shrink as shrink_blueprint
    from kbpc.util.atomic import write_text_atomic

    bp = load_blueprint(blueprint, config_path)
    values: dict[str, int] = {}
    if preset:
        chosen = PRESETS[preset].get(bp.config.engine)
        if chosen is None:
            raise KbpcError(f"preset {preset!r} has no sizes for engine {bp.config.engine!r}", "--preset")
        values.update(chosen["symbols"])
        layer_pattern = layer_pattern or chosen["layers"]
    layers = None
    if like_path is not None:
        from kbpc.tools.shrink_like import like_layers, like_symbols, read_like
        if preset or layer_pattern:
            raise KbpcError("--like sets the sizes and layers; drop --preset and --layers", "--like")
        hf = read_like(bp, like_path)
        values.update(like_symbols(bp, hf))
        layers = like_layers(bp, hf)
    values.update(parse_assignments(assignments))
    doc = shrink_blueprint(bp, values, layers if layers is not None else select_layers(bp, layer_pattern))
    write_text_atomic(output, json.dumps(doc, indent=1) + "\n")
    report = {"schema": "kbpc-shrink/v1", "output": str(output), "layers": len(doc["layers"]),
              "nodes": len(doc["nodes"]), "edges": len(doc["edges"]), "groups": len(doc["groups"])}
    if not emit_report(report, as_json, json_out):
        click.echo(f"wrote {output}: {len(doc['layers'])} layers, {len(doc['nodes'])} nodes, "
                   f"{len(doc['edges'])} edges, {len(doc['groups'])} groups")


@main.command("convert")
@click.argument("checkpoint", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="New folder for the converted weights (written whole or not at all).")
@click.option("--blueprint", "blueprint", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The blueprint the weights are for (its node names, shapes and formats).")
@click.option("--shard-mb", type=click.IntRange(min=1), default=2048, show_default=True,
              help="Largest safetensors shard to write, in MB.")
@CONFIG_OPTION
@reports_errors
def convert_cmd(checkpoint: Path, output: Path, blueprint: Path, shard_mb: int, config_path: Path | None) -> None:
    """Convert a Hugging Face checkpoint folder (ModelOpt NVFP4 export) once into the blueprint's
    weights (MLA absorption, expert stacking, conventions), recording the source files' hashes;
    use the output folder as --weights."""
    from kbpc.weights.convert import convert

    record = convert(blueprint, checkpoint, output, config_path, shard_mb << 20)
    click.echo(f"wrote {output}: {sum(s['tensors'] for s in record['shards'])} tensors in "
               f"{len(record['shards'])} shard(s), {sum(s['bytes'] for s in record['shards']) / 1e6:.1f} MB, "
               f"from {len(record['source']['files'])} source files")


@main.command("compile")
@click.argument("blueprint", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The .kbp bundle to write (atomically: a failed compile leaves nothing).")
@click.option("--target", default="sm_90", show_default=True,
              type=click.Choice(["sm_90", "sm_100", "sm_120", "sm_121"]), help="GPU target.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tensor-parallel size (recorded; only 1 is implemented).")
@click.option("--max-context", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Longest sequence the state and caches are sized for.")
@click.option("--numerics", type=click.Choice(["exact", "fast"]), default="fast", show_default=True,
              help="exact: every kernel bit-exact against the reference interpreter; fast: projections and "
                   "attention may change accumulation order or precision point, each within a stated "
                   "bound (recorded in the signed manifest).")
@click.option("--index-cache", type=click.Choice(["f32", "fp8"]), default="f32", show_default=True,
              help="The DSA indexer's pool-key cache: FP32, or Walsh-Hadamard rotated E4M3 with a power-of-two "
                   "scale per pool (a quarter of the bytes; recorded in the signed manifest, and the reference "
                   "interpreter follows it).")
@click.option("--fuse/--no-fuse", default=True, show_default=True,
              help="Merge groups across the blueprint's boundaries where a fused kernel form exists "
                   "(never changes the math).")
@click.option("--no-fuse-rule", "skip_fusions", multiple=True, metavar="RULE",
              help="Leave one fusion rule unapplied (repeatable; compile prints the rules it applied).")
@click.option("--fuse-rule", "add_fusions", multiple=True, metavar="RULE",
              help="Also apply an opt-in fusion rule (repeatable; compile says which rules are opt-in and why).")
@click.option("--pdl/--no-pdl", default=True, show_default=True,
              help="Programmatic dependent launch: each kernel may start while the one before it drains; and "
                   "launch priorities: the kernels on the modelled critical path go first where kernels of "
                   "several streams wait for SMs. --no-pdl builds the plain baseline with neither.")
@click.option("--no-act-quant", is_flag=True,
              help="Debugging aid, never for production: keep activations in BF16/FP32 where the blueprint "
                   "quantizes them to NVFP4 or FP8 (projections multiply dequantized weights, the MLA latent "
                   "cache holds FP32 rows). Compares kbpc with implementations that do not quantize "
                   "activations; recorded in the manifest, and `verify --numerics` holds it to the fast "
                   "criterion against the reference's unquantized variant.")
@click.option("--pdl-across-events/--no-pdl-across-events", default=True, show_default=True,
              help="Also launch with PDL the first kernel after a cross-stream event wait, so its work before "
                   "griddepcontrol.wait (weights, its own state) overlaps the kernels it waits for. Graph "
                   "capture makes the same-stream edge programmatic; every kernel waits in griddepcontrol.wait "
                   "before reading step data, so it is correct whichever edge capture makes "
                   "(tests/gpu/test_gpu_pdl_events.py). Measured on an H200 (128-expert seed shrink, 1k): "
                   "6.04-6.05 ms a step against 6.13-6.20 ms without, logits bit-equal.")
@click.option("--max-streams", type=click.IntRange(min=1), default=4, show_default=True,
              help="Most parallel streams the scheduler may use for independent groups (1: one stream, "
                   "no events).")
@click.option("--key", "key_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Private key file to sign with (default: $KBPC_SIGNING_KEY, else the local default "
                   "key, created on first use only at a terminal; in CI pass --key or set the variable).")
@click.option("--weights", "weights_path", type=click.Path(path_type=Path), default=None,
              help="A safetensors checkpoint: its hashes are recorded (lite bundle), or with "
                   "--embed-weights it is stored in the bundle (full bundle).")
@click.option("--embed-weights", is_flag=True, help="Store the --weights checkpoint in the bundle.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Object cache (default: the user cache dir); unchanged kernels are never rebuilt.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help="Parallel nvcc jobs (default: CPUs).")
@click.option("--verify", is_flag=True, help="Check the IR invariants after every pass.")
@click.option("--debug-arena", is_flag=True,
              help="Give every intermediate its own arena bytes (no reuse), so `kbpc verify --numerics "
                   "--intermediates` can compare each one with the reference.")
@click.option("--dump-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write every pass's plan and the generated sources here.")
@click.option("--stamps", is_flag=True,
              help="Profiling build: the instrumented kernels record when each CTA reaches each phase "
                   "(%globaltimer, in the replayed step; bench/replay_stamps.py reads them). The math and "
                   "the plan are the same as without; the stamps cost each instrumented CTA an atomic and "
                   "a few stores. Recorded in the manifest (step.stamps); not for production bundles.")
@CONFIG_OPTION
@json_options
@reports_errors
def compile_cmd(blueprint: Path, output: Path, target: str, tp: int, max_context: int, numerics: str,
                index_cache: str, fuse: bool, skip_fusions: tuple[str, ...], add_fusions: tuple[str, ...], pdl: bool,
                no_act_quant: bool, pdl_across_events: bool, max_streams: int, key_path: Path | None,
            weights_path: Path | None, embed_weights: bool, cache_dir: Path | None, jobs: int | None,
            verify: bool, debug_arena: bool, dump_dir: Path | None, stamps: bool, config_path: Path | None,
            as_json: bool, json_out: Path | None) -> None:
    """Compile a blueprint into a signed .kbp bundle (passes, code generation, nvcc, bundle, sign).
    The build report (--json, --json-out) records the stages, the objects built or cached and the
    toolchain."""
    import time

    from kbpc.bundle.keystore import may_create_default_key, signing_key
    from kbpc.compiler import CompileRequest, compile_bundle
    from kbpc.ir.plan import Options
    from kbpc.report.build_report import build_report, summary_line
    from kbpc.report.progress import CompileProgress

    if embed_weights and weights_path is None:
        raise KbpcError("--embed-weights needs --weights CHECKPOINT", "--embed-weights")
    request = CompileRequest(blueprint=blueprint, output=output,
                             options=Options(target=target, tp=tp, max_context=max_context,
                                             arena_reuse=not debug_arena, numerics=numerics, fuse=fuse, pdl=pdl,
                                             pdl_across_events=pdl_across_events, max_streams=max_streams,
                                             skip_fusions=tuple(sorted(set(skip_fusions))),
                                             add_fusions=tuple(sorted(set(add_fusions))),
                                             index_cache=index_cache, act_quant=not no_act_quant),
                             signer=signing_key(key_path, may_create_default_key(),
                                                lambda note: click.echo(note, err=True)),
                             config=config_path, cache_dir=cache_dir,
                             jobs=jobs, weights=weights_path, embed_weights=embed_weights, verify=verify,
                             dump_dir=dump_dir, stamps=stamps)
    t0 = time.perf_counter()
    with CompileProgress() as progress:
        result = compile_bundle(request, progress)
    report = build_report(result, output, list(result.key_ids), progress.stage_times(), time.perf_counter() - t0)
    if not emit_report(report, as_json, json_out):
        for line in result.fusion.lines():
            click.echo(line)
        click.echo(summary_line(report))


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise KbpcError(f"expected comma-separated token ids, got {text!r}", "--prompt-ids") from None


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--prompt-ids", default="1", show_default=True, help="Comma-separated prompt token ids.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--weights", "weights_source", default=None,
              help="synthetic:SEED (counter-based synthetic weights), a safetensors file/folder, a Hugging "
                   "Face checkpoint folder, or 'embedded' (a full bundle's own). Default: a full bundle's "
                   "own weights, else synthetic:0. A bundle that binds a checkpoint accepts only it.")
@click.option("--backend", type=click.Choice(["auto", "reference", "cuda"]), default="auto",
              show_default=True, help="auto: the GPU when one is present (a blueprint JSON is first "
                                      "compiled for it into the user cache), else the CPU reference "
                                      "backend.")
@click.option("--context", type=click.IntRange(min=1), default=None,
              help="Maximum context in tokens (default: prompt + new tokens).")
@json_options
@click.option("--logits", "logits_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write every position's logits, prompt positions included, as a float32 "
                   "positions x vocab .npy file (written atomically).")
@click.option("--digest/--no-digest", default=True, show_default=True,
              help="Report a SHA-256 of every position's logits (a checksum to compare runs). "
                   "--no-digest: on the GPU the logits stay there; the greedy token is picked on the "
                   "GPU and 8 bytes a step come back (the fastest decode). Non-finite logits stop the "
                   "run either way.")
@click.option("--no-act-quant", is_flag=True,
              help="Debugging aid: keep activations in BF16/FP32 where the blueprint quantizes them to "
                   "NVFP4 or FP8 (never the default). The reference backend runs its unquantized "
                   "variant; on the GPU a blueprint JSON is compiled with --no-act-quant, and a bundle "
                   "must have been.")
@click.option("--numerics", type=click.Choice(["exact", "fast"]), default="fast", show_default=True,
              help="For a blueprint JSON compiled for this GPU on the way: the numerics mode it is "
                   "compiled with (a bundle runs in the mode it was compiled with).")
@click.option("--tp", type=click.IntRange(min=1), default=None,
              help="Ranks of a tensor-parallel bundle (one process per GPU on this host; under "
                   "mpirun each process is one rank). Default: the bundle's.")
@TRUST_OPTION
@CONFIG_OPTION
@reports_errors
def run(model: Path, prompt_ids: str, max_new_tokens: int, weights_source: str, backend: str,
        context: int | None, as_json: bool, json_out: Path | None, logits_path: Path | None, digest: bool,
        no_act_quant: bool, numerics: str, tp: int | None, trust_paths: tuple[Path, ...], config_path: Path | None) -> None:
    """Decode tokens greedily from MODEL (a signed .kbp bundle, verified before anything is loaded,
    or a blueprint JSON for the reference backend) and report the ids and tokens/s. --weights
    takes synthetic:SEED, a safetensors checkpoint in kbpc's names, or a Hugging Face checkpoint
    folder (ModelOpt NVFP4 export), whose config.json then sets the model config."""
    from rich.progress import Progress

    from kbpc.bundle.keystore import trusted_keyring
    from kbpc.runtime.generate import check_prompt, generate
    from kbpc.runtime.select import choose_backend, is_bundle, open_backend

    prompt = _parse_ids(prompt_ids)
    from kbpc.runtime.tp_run import run_split

    split = run_split(model, tp, prompt, max_new_tokens, weights_source, tuple(trust_paths), backend=backend,
                      config=config_path)
    if split is not None:
        if "rank" not in split:   # mpirun: only rank 0 reports
            _report_run({"schema": "kbpc-run/v1", "backend": "cuda", "model": str(model),
                         "weights": weights_source or "default", **split}, as_json, json_out)
        return
    ctx = context or len(prompt) + max_new_tokens
    source = model
    chosen = choose_backend(model, backend, act_quant=not no_act_quant)
    trust = trusted_keyring(trust_paths) if trust_paths else None
    if chosen == "cuda" and not is_bundle(model):   # compile for this GPU first (cached)
        from kbpc.compiler import compile_for_run
        from kbpc.runtime.device import local_device

        device = local_device()
        if device.target is None:
            raise KbpcError(f"kbpc cannot build for this GPU: {device.describe()}", "GPU")
        model, trust = compile_for_run(model, config_path, ctx, device.target, weights_source, numerics,
                                       act_quant=not no_act_quant)
    step_backend, vocab = open_backend(model, chosen, weights_source, ctx, trust, config_path,
                                       act_quant=not no_act_quant)
    check_prompt(prompt, vocab)
    steps = len(prompt) + max_new_tokens - 1
    rows: list = []
    with Progress(transient=True, disable=as_json or steps < 8) as progress:
        task = progress.add_task(f"decoding ({chosen} backend)", total=steps)
        result = generate(step_backend, prompt, max_new_tokens, on_token=lambda _: progress.advance(task),
                          on_logits=rows.append if logits_path else None, digest=digest)
    if logits_path is not None:
        _write_logits(logits_path, rows)
    _report_run({"schema": "kbpc-run/v1", "backend": chosen, "model": str(source),
                 "weights": weights_source or "default", **result.to_json()}, as_json, json_out)


def _report_run(summary: dict, as_json: bool, json_out: Path | None) -> None:
    if emit_report(summary, as_json, json_out):
        return
    click.echo(f"backend: {summary['backend']}   weights: {summary['weights']}")
    click.echo(f"prompt ids:    {','.join(map(str, summary['prompt_ids']))}")
    click.echo(f"generated ids: {','.join(map(str, summary['generated_ids']))}")
    click.echo(f"time per token: {summary['ms_per_token']:.2f} ms   decode: "
               f"{summary['decode_tokens_per_s'] or 0:.2f} tok/s   logits sha256: "
               f"{(summary['logits_sha256'] or '')[:16] or 'not computed (--no-digest)'}")


def _write_logits(path: Path, rows: list) -> None:
    import io

    import numpy as np

    from kbpc.util.atomic import atomic_writer

    buf = io.BytesIO()
    np.save(buf, np.stack(rows).astype(np.float32))
    with atomic_writer(path) as fh:
        fh.write(buf.getvalue())


@main.command()
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--context", type=click.IntRange(min=0), default=1024, show_default=True,
              help="Sequence position to measure at.")
@click.option("--runs", type=click.IntRange(min=3), default=30, show_default=True)
@click.option("--weights", "weights_source", default="synthetic:0", show_default=True)
@json_options
@click.option("--bandwidth", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Copy bandwidth in GB/s for the floors (default: measured on this GPU at start).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the profiled step as a Chrome/Perfetto trace (JSON; one track per stream).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Draw each family's time against its floor into this PNG (needs kbpc[plot]).")
@TRUST_OPTION
@reports_errors
def bench(bundle: Path, context: int, runs: int, weights_source: str, as_json: bool, json_out: Path | None,
          bandwidth: float | None, trace_path: Path | None, plot_path: Path | None,
          trust_paths: tuple[Path, ...]) -> None:
    """Measure a bundle on the GPU: tokens/s at batch 1 and time per kernel family against the
    bandwidth floor (bytes moved / the GPU's copy bandwidth, measured at start unless given)."""
    from rich.table import Table

    from kbpc.bundle.keystore import trusted_keyring
    from kbpc.report.render import console
    from kbpc.runtime.bench import run_bench
    from kbpc.runtime.bundle_model import load_bundle_model

    if plot_path is not None:
        import importlib.util
        if importlib.util.find_spec("matplotlib") is None:   # before minutes of measuring
            raise KbpcError("--plot needs matplotlib: pip install 'kbpc[plot]'", "--plot")
    model = load_bundle_model(bundle, trusted_keyring(trust_paths))
    r, measured, plan = run_bench(model, context, runs, weights=weights_source,
                                  bandwidth=bandwidth * 1e9 if bandwidth is not None else None)
    if trace_path is not None:
        from kbpc.runtime.bench_report import chrome_trace
        from kbpc.util.atomic import write_text_atomic
        write_text_atomic(trace_path, json.dumps(chrome_trace(model.run, plan, measured, model.run.blueprint_id)) + "\n")
    if plot_path is not None:
        from kbpc.runtime.bench_report import plot_families
        plot_families(r, plot_path)
    if emit_report(r, as_json, json_out):
        return
    spread = r["step_ms_spread"]
    click.echo(f"{r['tokens_per_s']:.1f} tok/s ({r['step_ms_median']:.3f} ms/step median of {r['runs']}, "
               f"10-90% {spread['p10']:.3f}-{spread['p90']:.3f}) at "
               f"context {r['context']}; floor {r['floor_ms']:.3f} ms ({r['bytes_per_token'] / 1e9:.2f} GB/token "
               f"at {r['bandwidth']['bytes_per_s'] / 1e12:.2f} TB/s) = {100 * r['roofline_fraction']:.1f}% of "
               f"roofline; {r['launches_per_step']} launches"
               + (f", {r['graph_edges']['programmatic']} of the graph's {r['graph_edges']['total']} edges "
                  "programmatic" if r.get("graph_edges") else ""))
    click.echo(f"device: {r['device']}; copy bandwidth {r['bandwidth']['bytes_per_s'] / 1e12:.2f} TB/s "
               f"({r['bandwidth']['source']})")
    per = "launches" if r.get("profile_marks") == "launch" else "groups"   # what each profile mark timed
    table = Table(title=f"profiled step (serialized, a mark per {per[:-1]}): {r['profiled_step_ms']:.3f} ms")
    for col in ("family", per, "us", "floor us", "% of floor"):
        table.add_column(col, justify="left" if col == "family" else "right")
    for name, f in r["families"].items():
        frac = f"{100 * f['fraction']:.1f}" if f["fraction"] else "-"
        table.add_row(name, str(f["groups"]), f"{f['us']:.1f}", f"{f['floor_us']:.1f}", frac)
    console().print(table)


main.add_command(keygen)
main.add_command(sign)
main.add_command(verify)
main.add_command(cache)

if __name__ == "__main__":
    main()
