"""`kbpc keygen`, `kbpc sign` and `kbpc verify`: thin click commands over kbpc.bundle, registered
into the `kbpc` group by kbpc/cli.py."""
from __future__ import annotations

from pathlib import Path

import click

from kbpc.bundle.container import resign_bundle, verify_bundle
from kbpc.bundle.keys import (Signer, default_key_dir, default_key_paths, ensure_default_key,
                              generate_keys, trusted_keyring)
from kbpc.cli_options import reports_errors
from kbpc.report.render import human_bytes

TRUST_OPTION = click.option(
    "--trust", "trust_paths", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
    help="Keyring file of trusted public keys (repeatable). Default: the keyring of your default "
         "key, in the kbpc config directory.")


@click.command()
@click.option("-o", "--output-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for signing-key.json (private, mode 0600) and signing-key.pub.json "
                   "(the keyring to share). Default: the kbpc config directory.")
@click.option("--force", is_flag=True, help="Replace an existing private key there.")
@reports_errors
def keygen(output_dir: Path | None, force: bool) -> None:
    """Create a signing key: an Ed25519 and an ML-DSA-65 key pair. Bundles carry a signature from
    each; verifiers trust the public keyring."""
    paths = generate_keys(output_dir or default_key_dir(), overwrite=force)
    signer = Signer.load(paths.private)
    click.echo(f"private key:    {paths.private}  (keep it secret)")
    click.echo(f"public keyring: {paths.public}  (give it to whoever verifies your bundles)")
    click.echo(f"key ids:        {', '.join(signer.key_ids)}")


@click.command()
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--key", "key_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Private key file (default: your default key, created on first use).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the re-signed bundle here (default: replace BUNDLE, atomically).")
@click.option("--trust", "trust_paths", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Also require the bundle's current signatures to verify against this keyring "
                   "(repeatable). Without it only the members are checked against the manifest.")
@reports_errors
def sign(bundle: Path, key_path: Path | None, output: Path | None, trust_paths: tuple[Path, ...]) -> None:
    """Re-sign BUNDLE: a new signature.json from KEY; every other byte stays the same."""
    if key_path is None:
        key_path, created = ensure_default_key()
        if created:
            click.echo(f"created a default signing key at {key_path} (public keyring: "
                       f"{default_key_paths().public})")
    signer = Signer.load(key_path)
    trust = trusted_keyring(trust_paths) if trust_paths else None
    key_ids = resign_bundle(bundle, signer, output, trust)
    click.echo(f"signed {output or bundle} with {', '.join(key_ids)}")


@click.command()
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@TRUST_OPTION
@click.option("-q", "--quiet", is_flag=True, help="Print only the verdict.")
@click.option("--numerics", is_flag=True,
              help="Also run the bundle on the GPU against the reference interpreter (same synthetic "
                   "weights, teacher-forced tokens) and check every position's logits.")
@click.option("--positions", type=click.IntRange(min=1), default=64, show_default=True,
              help="Positions for --numerics.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --numerics: write the per-position report here.")
@click.option("--intermediates", is_flag=True,
              help="With --numerics on a --debug-arena bundle: compare every intermediate buffer of "
                   "the step with the reference and list them in launch order.")
@click.option("--weights", "weights_source", default="synthetic:0", show_default=True,
              help="With --numerics: synthetic:SEED, a safetensors checkpoint or a Hugging Face "
                   "checkpoint folder.")
@reports_errors
def verify(bundle: Path, trust_paths: tuple[Path, ...], quiet: bool, numerics: bool, positions: int,
           json_path: Path | None, intermediates: bool, weights_source: str) -> None:
    """Check BUNDLE before anything in it is used: canonical zip with STORED entries, both
    signatures (Ed25519 and ML-DSA-65) valid and by trusted keys, every member's size and SHA-256
    as the signed manifest records, no member added or missing. Exit code 2 on any failure."""
    trust = trusted_keyring(trust_paths)
    on_check = None if quiet else (lambda check: click.echo(f"  ok  {check}"))
    report = verify_bundle(bundle, trust, on_check)
    click.echo(f"verified {bundle}: {report.members} members, {human_bytes(report.total_bytes)}, "
               f"signed by {', '.join(report.signers)}")
    if numerics and intermediates:
        _check_intermediates(bundle, trust, positions, quiet, weights_source)
    if numerics:
        _check_numerics(bundle, trust, positions, json_path, quiet, weights_source)


def _check_intermediates(bundle: Path, trust, positions: int, quiet: bool, weights: str) -> None:
    from kbpc.runtime.bundle_model import load_bundle_model
    from kbpc.runtime.numerics import compare_intermediates

    diffs = compare_intermediates(load_bundle_model(bundle, trust), weights=weights, steps=positions)
    bad = [d for d in diffs if d.rel_l2 > 1e-2]
    click.echo(f"intermediates at position {positions - 1}: {len(diffs)} buffers, {len(bad)} with rel err > 1e-2 "
               "(launch order; * marks them)")
    for d in diffs:
        if d.rel_l2 > 1e-2 or not quiet:
            flag = "*" if d.rel_l2 > 1e-2 else " "
            click.echo(f" {flag} {d.position:4d} {d.name:<40} {d.format:<10} {d.rel_l2:.2e}  {d.detail}")


def _check_numerics(bundle: Path, trust, positions: int, json_path: Path | None, quiet: bool,
                    weights: str) -> None:
    import json

    from kbpc.errors import KbpcError
    from kbpc.runtime.bundle_model import load_bundle_model
    from kbpc.runtime.numerics import compare_numerics
    from kbpc.util.atomic import write_text_atomic

    def show(pos: int, rep) -> None:
        if not quiet:
            click.echo(f"  position {pos:3d}: rel L2 {rep.rel_l2[-1]:.2e}  same token {rep.same_token[-1]}")

    report = compare_numerics(load_bundle_model(bundle, trust), positions, weights=weights, on_position=show)
    if json_path:
        write_text_atomic(json_path, json.dumps(report.to_json(), indent=1) + "\n")
    rel_limit, agree_limit = report.limits
    click.echo(f"numerics ({report.mode} mode): max rel L2 {report.max_rel_l2:.3e} (limit {rel_limit:g}), same "
               f"greedy token at {100 * report.agreement:.1f}% of {positions} positions (limit "
               f"{100 * agree_limit:g}%)")
    if not report.passed:
        raise KbpcError("the GPU step does not match the reference within the limits", str(bundle))
