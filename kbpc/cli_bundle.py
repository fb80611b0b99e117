"""`kbpc keygen`, `kbpc sign` and `kbpc verify`: thin click commands over kbpc.bundle, registered
into the `kbpc` group by kbpc/cli.py."""
from __future__ import annotations

from pathlib import Path

import click

from kbpc.bundle.container import resign_bundle
from kbpc.bundle.keys import Signer
from kbpc.bundle.keystore import (PRIVATE_NAME, PUBLIC_NAME, default_key_dir, generate_keys,
                                  may_create_default_key, signing_key, trusted_keyring)
from kbpc.cli_options import TRUST_OPTION, emit_report, json_options, reports_errors
from kbpc.errors import KbpcError
from kbpc.settings import PASSPHRASE_ENV, key_passphrase


@click.command()
@click.option("-o", "--output-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help=f"Directory for {PRIVATE_NAME} (PKCS#8 PEM, mode 0600) and {PUBLIC_NAME} "
                   "(the keyring to share). Default: the kbpc config directory.")
@click.option("--force", is_flag=True, help="Replace an existing private key there.")
@click.option("--encrypt", is_flag=True,
              help=f"Encrypt the private key with a passphrase ({PASSPHRASE_ENV}, or asked for at a terminal).")
@json_options
@reports_errors
def keygen(output_dir: Path | None, force: bool, encrypt: bool, as_json: bool, json_out: Path | None) -> None:
    """Create a signing key: an Ed25519 and an ML-DSA-65 key pair. Bundles carry a signature from
    each; verifiers trust the public keyring."""
    passphrase = None
    if encrypt:
        passphrase = key_passphrase()
        if passphrase is None and not may_create_default_key():
            raise KbpcError(f"--encrypt needs a passphrase: set {PASSPHRASE_ENV}", "--encrypt")
        if passphrase is None:
            passphrase = click.prompt("passphrase", hide_input=True, confirmation_prompt=True).encode()
    paths = generate_keys(output_dir or default_key_dir(), overwrite=force, passphrase=passphrase)
    signer = Signer.load(paths.private, passphrase)
    report = {"schema": "kbpc-keygen/v1", "private_key": str(paths.private), "keyring": str(paths.public),
              "key_ids": signer.key_ids, "encrypted": encrypt}
    if emit_report(report, as_json, json_out):
        return
    click.echo(f"private key:    {paths.private}  (keep it secret{'; encrypted' if encrypt else ''})")
    click.echo(f"public keyring: {paths.public}  (give it to whoever verifies your bundles)")
    click.echo(f"key ids:        {', '.join(signer.key_ids)}")


@click.command()
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--key", "key_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Private key file (default: $KBPC_SIGNING_KEY, else your default key, created on "
                   "first use at a terminal).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the re-signed bundle here (default: replace BUNDLE, atomically).")
@click.option("--trust", "trust_paths", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Also require the bundle's current signatures to verify against this keyring "
                   "(repeatable; they add up). Without it only the members are checked against the manifest.")
@json_options
@reports_errors
def sign(bundle: Path, key_path: Path | None, output: Path | None, trust_paths: tuple[Path, ...],
         as_json: bool, json_out: Path | None) -> None:
    """Re-sign BUNDLE: a new signature.json from KEY; every other byte stays the same."""
    signer = signing_key(key_path, may_create_default_key(), lambda note: click.echo(note, err=True))
    signer = signer if isinstance(signer, Signer) else signer()
    trust = trusted_keyring(trust_paths) if trust_paths else None
    key_ids = resign_bundle(bundle, signer, output, trust)
    report = {"schema": "kbpc-sign/v1", "bundle": str(output or bundle), "key_ids": key_ids}
    if not emit_report(report, as_json, json_out):
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
@click.option("--intermediates", is_flag=True,
              help="With --numerics on a --debug-arena bundle: compare every intermediate buffer of "
                   "the step with the reference and list them in launch order.")
@click.option("--weights", "weights_source", default="synthetic:0", show_default=True,
              help="With --numerics: synthetic:SEED, a safetensors checkpoint or a Hugging Face "
                   "checkpoint folder.")
@json_options
@reports_errors
def verify(bundle: Path, trust_paths: tuple[Path, ...], quiet: bool, numerics: bool, positions: int,
           intermediates: bool, weights_source: str, as_json: bool, json_out: Path | None) -> None:
    """Check BUNDLE before anything in it is used: canonical zip with STORED entries, both
    signatures (Ed25519 and ML-DSA-65) valid and by trusted keys, every member's size and SHA-256
    as the signed manifest records, no member added or missing. Exit code 3 on any failure."""
    from kbpc.bundle.container import verify_bundle
    from kbpc.bundle.keystore import trusted_keyring
    from kbpc.report.render import human_bytes

    trust = trusted_keyring(trust_paths)
    say = (lambda text: None) if as_json else click.echo
    on_check = None if quiet else (lambda check: say(f"  ok  {check}"))
    checked = verify_bundle(bundle, trust, on_check)
    say(f"verified {bundle}: {checked.members} members, {human_bytes(checked.total_bytes)}, "
        f"signed by {', '.join(checked.signers)}")
    report = {"schema": "kbpc-verify/v1", "bundle": str(bundle), "verified": True, "signers": checked.signers,
              "members": checked.members, "bytes": checked.total_bytes, "checks": checked.checks}
    failed = None
    if numerics and intermediates:
        report["intermediates"] = _check_intermediates(bundle, trust, positions, quiet, say, weights_source)
    if numerics:
        report["numerics"] = _check_numerics(bundle, trust, positions, quiet, say, weights_source)
        if not report["numerics"]["passed"]:
            report["verified"] = False
            failed = "the GPU step does not match the reference within the limits"
    emit_report(report, as_json, json_out)
    if failed:
        from kbpc.errors import VerificationError
        raise VerificationError(failed, str(bundle))


def _check_intermediates(bundle: Path, trust, positions: int, quiet: bool, say, weights: str) -> list[dict]:
    from kbpc.runtime.bundle_model import load_bundle_model
    from kbpc.runtime.numerics import compare_intermediates

    diffs = compare_intermediates(load_bundle_model(bundle, trust), weights=weights, steps=positions)
    bad = [d for d in diffs if d.rel_l2 > 1e-2]
    say(f"intermediates at position {positions - 1}: {len(diffs)} buffers, {len(bad)} with rel err > 1e-2 "
        "(launch order; * marks them)")
    for d in diffs:
        if d.rel_l2 > 1e-2 or not quiet:
            flag = "*" if d.rel_l2 > 1e-2 else " "
            say(f" {flag} {d.position:4d} {d.name:<40} {d.format:<10} {d.rel_l2:.2e}  {d.detail}")
    return [{"position": d.position, "name": d.name, "format": d.format, "rel_l2": d.rel_l2, "detail": d.detail}
            for d in diffs]


def _check_numerics(bundle: Path, trust, positions: int, quiet: bool, say, weights: str) -> dict:
    from kbpc.runtime.bundle_model import load_bundle_model
    from kbpc.runtime.numerics import compare_numerics

    def show(pos: int, rep) -> None:
        if not quiet:
            say(f"  position {pos:3d}: rel L2 {rep.rel_l2[-1]:.2e}  same token {rep.same_token[-1]}")

    report = compare_numerics(load_bundle_model(bundle, trust), positions, weights=weights, on_position=show)
    rel_limit, agree_limit = report.limits
    say(f"numerics ({report.mode} mode): max rel L2 {report.max_rel_l2:.3e} (limit {rel_limit:g}), same "
        f"greedy token at {100 * report.agreement:.1f}% of {positions} positions (limit {100 * agree_limit:g}%)")
    return report.to_json()
