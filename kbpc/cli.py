"""The kbpc command line: a thin click group. Commands parse options, call into the package and
print; errors of the project's own type become one line on stderr and exit code 2."""
from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from kbpc import __version__
from kbpc.bundle.commands import keygen, sign, verify
from kbpc.cli_options import CONFIG_OPTION, TRUST_OPTION, reports_errors
from kbpc.errors import KbpcError

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
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
def inspect(blueprint: Path, as_json: bool, bandwidth: float, context: int | None, tp: int,
            config_path: Path | None, trust_path: Path | None) -> None:
    """Show what a blueprint holds (layers, ops, kernel families and launches, solved symbols,
    weight bytes by format, bytes read per decode token, bandwidth-floor tokens/s), or what a
    verified .kbp bundle holds (manifest, signer, target, plan digest, member sizes)."""
    from kbpc.frontend.load import load_blueprint
    from kbpc.runtime.select import is_bundle

    if is_bundle(blueprint):
        from kbpc.bundle.container import open_bundle
        from kbpc.bundle.keys import trusted_keyring
        from kbpc.report.inspect_bundle import render_bundle_summary, summarize_bundle

        with open_bundle(blueprint, trusted_keyring([trust_path] if trust_path else [])) as bundle:
            summary = summarize_bundle(bundle)
        if as_json:
            click.echo(json.dumps(summary, indent=2))
        else:
            render_bundle_summary(summary, Console())
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
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        render_blueprint_summary(summary, Console())
        if tp > 1:
            from kbpc.report.parallel import render_tp
            render_tp(summary["tp"], Console())


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
@reports_errors
def shrink(blueprint: Path, output: Path, assignments: tuple[str, ...], layer_pattern: str | None,
           preset: str | None, like_path: Path | None, config_path: Path | None) -> None:
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
@click.option("--fuse/--no-fuse", default=True, show_default=True,
              help="Merge groups across the blueprint's boundaries where a fused kernel form exists "
                   "(never changes the math).")
@click.option("--pdl/--no-pdl", default=True, show_default=True,
              help="Programmatic dependent launch: each kernel may start while the one before it drains.")
@click.option("--key", "key_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Private key file to sign with (default: the local default key, created on first use).")
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
@CONFIG_OPTION
@reports_errors
def compile_cmd(blueprint: Path, output: Path, target: str, tp: int, max_context: int, numerics: str, fuse: bool,
                pdl: bool, key_path: Path | None,
            weights_path: Path | None, embed_weights: bool, cache_dir: Path | None, jobs: int | None,
            verify: bool, debug_arena: bool, dump_dir: Path | None, config_path: Path | None) -> None:
    """Compile a blueprint into a signed .kbp bundle (passes, code generation, nvcc, bundle, sign)."""
    import time

    from rich.console import Console
    from rich.progress import Progress

    from kbpc.bundle.keys import Signer, ensure_default_key
    from kbpc.compiler import CompileRequest, compile_bundle
    from kbpc.ir.plan import Options

    if embed_weights and weights_path is None:
        raise KbpcError("--embed-weights needs --weights CHECKPOINT", "--embed-weights")
    err = Console(stderr=True)
    if key_path is None:
        key_path, created = ensure_default_key()
        if created:
            err.print(f"created a signing key: {key_path} (public keyring beside it)")
    request = CompileRequest(blueprint=blueprint, output=output,
                             options=Options(target=target, tp=tp, max_context=max_context,
                                             arena_reuse=not debug_arena, numerics=numerics, fuse=fuse, pdl=pdl),
                             signer=Signer.load(key_path), config=config_path, cache_dir=cache_dir,
                             jobs=jobs, weights=weights_path, embed_weights=embed_weights, verify=verify,
                             dump_dir=dump_dir)
    t0 = time.perf_counter()
    with Progress(console=err, transient=True) as progress:
        stage = progress.add_task("front end", total=None)
        objects = progress.add_task("nvcc", total=None, visible=False)

        def on_object(name: str, cached: bool) -> None:
            progress.update(objects, visible=True, advance=1, description=f"nvcc {name.rsplit('/', 1)[-1][:48]}")

        result = compile_bundle(request, on_stage=lambda s: progress.update(stage, description=s),
                                on_object=on_object)
    m = result.manifest
    for line in result.fusion.lines():
        click.echo(line)
    click.echo(f"wrote {output}: {m['kind']} bundle, target {m['target']}, plan {m['plan_digest'][:12]}, "
               f"{m['step']['launches']} launches, {m['step']['kernel_instances']} kernel instances "
               f"({result.build.compiled} compiled, {result.build.cached} cached) in "
               f"{time.perf_counter() - t0:.1f} s")


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise KbpcError(f"expected comma-separated token ids, got {text!r}", "--prompt-ids") from None


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--prompt-ids", default="1", show_default=True, help="Comma-separated prompt token ids.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--weights", "weights_source", default="synthetic:0", show_default=True,
              help="synthetic:SEED (counter-based synthetic weights) or a safetensors file/folder.")
@click.option("--backend", type=click.Choice(["auto", "reference", "cuda"]), default="auto",
              show_default=True, help="auto: the GPU when one is present (a blueprint JSON is first "
                                      "compiled for it into the user cache), else the CPU reference "
                                      "backend.")
@click.option("--context", type=click.IntRange(min=1), default=None,
              help="Maximum context in tokens (default: prompt + new tokens).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--logits", "logits_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write every position's logits, prompt positions included, as a float32 "
                   "positions x vocab .npy file (written atomically).")
@click.option("--no-act-quant", is_flag=True,
              help="Debugging aid for the reference backend: keep activations in BF16/FP32 where the "
                   "blueprint quantizes them to NVFP4 or FP8 (never the default).")
@click.option("--tp", type=click.IntRange(min=1), default=None,
              help="Ranks of a tensor-parallel bundle (one process per GPU on this host; under "
                   "mpirun each process is one rank). Default: the bundle's.")
@TRUST_OPTION
@CONFIG_OPTION
@reports_errors
def run(model: Path, prompt_ids: str, max_new_tokens: int, weights_source: str, backend: str,
        context: int | None, as_json: bool, logits_path: Path | None, no_act_quant: bool, tp: int | None,
        trust_path: Path | None, config_path: Path | None) -> None:
    """Decode tokens greedily from MODEL (a signed .kbp bundle, verified before anything is loaded,
    or a blueprint JSON for the reference backend) and report the ids and tokens/s. --weights
    takes synthetic:SEED, a safetensors checkpoint in kbpc's names, or a Hugging Face checkpoint
    folder (ModelOpt NVFP4 export), whose config.json then sets the model config."""
    from rich.progress import Progress

    from kbpc.runtime.generate import check_prompt, generate
    from kbpc.runtime.select import open_backend

    prompt = _parse_ids(prompt_ids)
    from kbpc.runtime.tp_run import run_split

    split = run_split(model, tp, prompt, max_new_tokens, weights_source, trust_path, backend=backend,
                      config=config_path)
    if split is not None:
        if "rank" not in split:   # mpirun: only rank 0 reports
            _report_run({"backend": "cuda", "model": str(model), "weights": weights_source, **split}, as_json)
        return
    ctx = context or len(prompt) + max_new_tokens
    chosen, step_backend, vocab = open_backend(model, backend, weights_source, ctx, trust_path, config_path,
                                               act_quant=not no_act_quant)
    check_prompt(prompt, vocab)
    steps = len(prompt) + max_new_tokens - 1
    rows: list = []
    with Progress(transient=True, disable=as_json or steps < 8) as progress:
        task = progress.add_task(f"decoding ({chosen} backend)", total=steps)
        result = generate(step_backend, prompt, max_new_tokens, on_token=lambda _: progress.advance(task),
                          on_logits=rows.append if logits_path else None)
    if logits_path is not None:
        _write_logits(logits_path, rows)
    _report_run({"backend": chosen, "model": str(model), "weights": weights_source, **result.to_json()}, as_json)


def _report_run(summary: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"backend: {summary['backend']}   weights: {summary['weights']}")
    click.echo(f"prompt ids:    {','.join(map(str, summary['prompt_ids']))}")
    click.echo(f"generated ids: {','.join(map(str, summary['generated_ids']))}")
    click.echo(f"time per token: {summary['ms_per_token']:.2f} ms   decode: "
               f"{summary['decode_tokens_per_s'] or 0:.2f} tok/s   logits sha256: {summary['logits_sha256'][:16]}")


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
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the results as JSON (e.g. bench/results/<name>.json).")
@TRUST_OPTION
@reports_errors
def bench(bundle: Path, context: int, runs: int, weights_source: str, json_path: Path | None,
          trust_path: Path | None) -> None:
    """Measure a bundle on the GPU: tokens/s at batch 1 and time per kernel family against the
    bandwidth floor (bytes read / 4.3 TB/s)."""
    from rich.console import Console
    from rich.table import Table

    from kbpc.bundle.keys import Keyring
    from kbpc.runtime.bench import run_bench
    from kbpc.runtime.bundle_model import load_bundle_model
    from kbpc.util.atomic import write_text_atomic

    model = load_bundle_model(bundle, Keyring.load(trust_path) if trust_path else None)
    r = run_bench(model, context, runs, weights=weights_source)
    if json_path:
        write_text_atomic(json_path, json.dumps(r, indent=1) + "\n")
    click.echo(f"{r['tokens_per_s']:.1f} tok/s ({r['step_ms_median']:.3f} ms/step median of {r['runs']}) at "
               f"context {r['context']}; floor {r['floor_ms']:.3f} ms ({r['bytes_per_token'] / 1e9:.2f} GB/token "
               f"at 4.3 TB/s) = {100 * r['roofline_fraction']:.1f}% of roofline; {r['launches_per_step']} launches")
    table = Table(title=f"profiled step (serialized): {r['profiled_step_ms']:.3f} ms")
    for col in ("family", "groups", "us", "floor us", "% of floor"):
        table.add_column(col, justify="left" if col == "family" else "right")
    for name, f in r["families"].items():
        frac = f"{100 * f['fraction']:.1f}" if f["fraction"] else "-"
        table.add_row(name, str(f["groups"]), f"{f['us']:.1f}", f"{f['floor_us']:.1f}", frac)
    Console().print(table)


main.add_command(keygen)
main.add_command(sign)
main.add_command(verify)

if __name__ == "__main__":
    main()
