"""`kbpc cache info` and `kbpc cache clean`: the object cache and the bundles `kbpc run` compiles
for the local GPU. Registered into the `kbpc` group by kbpc/cli.py."""
from __future__ import annotations

from pathlib import Path

import click

from kbpc.cli_options import emit_report, json_options, reports_errors

CACHE_DIR_OPTION = click.option(
    "--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Object cache folder (default: $KBPC_CACHE_DIR/build, else the user cache folder).")


@click.group()
def cache() -> None:
    """The build cache: compiled objects (reused while a kernel's source, the headers, the flags,
    the target and nvcc are unchanged; least recently used ones evicted past KBPC_CACHE_LIMIT,
    default 5G) and the bundles `kbpc run BLUEPRINT.json` compiles for the local GPU."""


def _run_bundles() -> tuple[int, int]:
    from kbpc.toolchain.cache import run_bundle_dir

    found = sorted(run_bundle_dir().glob("*.kbp"))
    return len(found), sum(p.stat().st_size for p in found)


@cache.command()
@CACHE_DIR_OPTION
@json_options
@reports_errors
def info(cache_dir: Path | None, as_json: bool, json_out: Path | None) -> None:
    """Where the caches are and how much they hold."""
    from kbpc.report.render import human_bytes
    from kbpc.toolchain.cache import ObjectCache, run_bundle_dir

    objects = ObjectCache(cache_dir).info()
    count, size = _run_bundles()
    report = {"schema": "kbpc-cache-info/v1", "objects": objects.to_json(),
              "run_bundles": {"root": str(run_bundle_dir()), "bundles": count, "bytes": size}}
    if emit_report(report, as_json, json_out):
        return
    click.echo(f"objects:     {objects.root}: {objects.entries} objects, {human_bytes(objects.bytes)} "
               f"(limit {human_bytes(objects.limit)}); {objects.temp_items} build folders, "
               f"{human_bytes(objects.temp_bytes)}")
    click.echo(f"run bundles: {run_bundle_dir()}: {count} bundles, {human_bytes(size)}")


@cache.command()
@CACHE_DIR_OPTION
@click.option("--keep", metavar="SIZE", default=None,
              help="Keep the most recently used objects up to SIZE (e.g. 1G) instead of removing all; "
                   "run bundles are kept.")
@json_options
@reports_errors
def clean(cache_dir: Path | None, keep: str | None, as_json: bool, json_out: Path | None) -> None:
    """Remove cached objects, leftover build folders and compiled run bundles (a running compile's
    folder is kept)."""
    from kbpc.settings import parse_size
    from kbpc.report.render import human_bytes
    from kbpc.toolchain.cache import ObjectCache, run_bundle_dir

    objects = ObjectCache(cache_dir)
    if keep is not None:
        freed = objects.trim(parse_size(keep, "--keep"))
    else:
        freed = objects.clean()
        for bundle in sorted(run_bundle_dir().glob("*.kbp")):
            freed += bundle.stat().st_size
            bundle.unlink(missing_ok=True)
    if not emit_report({"schema": "kbpc-cache-clean/v1", "root": str(objects.root), "freed_bytes": freed},
                       as_json, json_out):
        click.echo(f"freed {human_bytes(freed)}")
