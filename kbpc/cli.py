"""The kbpc command line: a thin click group. Commands parse options, call into the package and
print; errors of the project's own type become one line on stderr and exit code 2."""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click
from rich.console import Console

from kbpc import __version__
from kbpc.errors import KbpcError

CONFIG_OPTION = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Model config JSON overriding symbols and constants the blueprint does not carry "
         '(e.g. {"symbols": {"q_heads": 32}, "constants": {"swiglu_limit": 7.0}}).')


def reports_errors(fn):
    """Turn KbpcError into a one-line message and exit code 2 (no traceback)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KbpcError as exc:
            click.echo(f"kbpc: error: {exc}", err=True)
            sys.exit(exc.exit_code)
    return wrapper


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
@CONFIG_OPTION
@reports_errors
def inspect(blueprint: Path, as_json: bool, bandwidth: float, config_path: Path | None) -> None:
    """Show what a blueprint holds: layers, ops, kernel families and launches, solved symbols,
    weight bytes by format, bytes read per decode token and the bandwidth-floor tokens/s."""
    from kbpc.frontend.load import load_blueprint
    from kbpc.report.inspect_blueprint import summarize
    from kbpc.report.render import render_blueprint_summary

    summary = summarize(load_blueprint(blueprint, config_path), bandwidth)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        render_blueprint_summary(summary, Console())


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
@CONFIG_OPTION
@reports_errors
def shrink(blueprint: Path, output: Path, assignments: tuple[str, ...], layer_pattern: str | None,
           preset: str | None, config_path: Path | None) -> None:
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
    values.update(parse_assignments(assignments))
    doc = shrink_blueprint(bp, values, select_layers(bp, layer_pattern))
    write_text_atomic(output, json.dumps(doc, indent=1) + "\n")
    click.echo(f"wrote {output}: {len(doc['layers'])} layers, {len(doc['nodes'])} nodes, "
               f"{len(doc['edges'])} edges, {len(doc['groups'])} groups")


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
              show_default=True, help="auto: the GPU for a compiled .kbp bundle when one is present, "
                                      "else the CPU reference backend.")
@click.option("--context", type=click.IntRange(min=1), default=None,
              help="Maximum context in tokens (default: prompt + new tokens).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@CONFIG_OPTION
@reports_errors
def run(model: Path, prompt_ids: str, max_new_tokens: int, weights_source: str, backend: str,
        context: int | None, as_json: bool, config_path: Path | None) -> None:
    """Decode tokens greedily from MODEL (a blueprint JSON; compiled .kbp bundles come with
    `kbpc compile`) and report the generated ids and tokens/s."""
    from rich.progress import Progress

    from kbpc.frontend.load import load_blueprint
    from kbpc.runtime.generate import check_prompt, generate
    from kbpc.runtime.reference_backend import ReferenceBackend, load_weights

    if model.suffix == ".kbp":
        raise KbpcError("running a .kbp bundle needs the CUDA runner, which is not built yet; "
                        "run the blueprint JSON with --backend reference", str(model))
    if backend == "cuda":
        raise KbpcError("the CUDA backend runs compiled .kbp bundles (kbpc compile), not blueprint "
                        "JSON; use --backend reference", "--backend")
    bp = load_blueprint(model, config_path)
    prompt = _parse_ids(prompt_ids)
    if "vocab" in bp.symbols:
        check_prompt(prompt, bp.symbols["vocab"])
    weights = load_weights(bp, weights_source)
    ctx = context or len(prompt) + max_new_tokens
    steps = len(prompt) + max_new_tokens - 1
    with Progress(transient=True, disable=as_json or steps < 8) as progress:
        task = progress.add_task("decoding (reference backend)", total=steps)
        result = generate(ReferenceBackend(bp, weights, ctx), prompt, max_new_tokens,
                          on_token=lambda _: progress.advance(task))
    summary = {"backend": "reference", "model": str(model), "weights": weights_source, **result.to_json()}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"backend: reference (CPU numpy)   weights: {weights_source}")
    click.echo(f"prompt ids:    {','.join(map(str, result.prompt_ids))}")
    click.echo(f"generated ids: {','.join(map(str, result.generated_ids))}")
    click.echo(f"time per token: {summary['ms_per_token']:.1f} ms   decode: "
               f"{summary['decode_tokens_per_s'] or 0:.2f} tok/s   logits sha256: {result.logits_sha256[:16]}")


if __name__ == "__main__":
    main()
