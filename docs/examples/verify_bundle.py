#!/usr/bin/env python3
"""Verify a .kbp bundle without kbpc: only the Python standard library and `cryptography` (48 or
later, for ML-DSA-65). It performs the checks docs/bundle-format.md describes, in that order:

  1. the container: a zip whose entries are all STORED (no compression), manifest.json and
     signature.json last and in that order, the other entries sorted by path, each once;
  2. manifest.json is canonical JSON (sorted keys, no spaces, UTF-8, one trailing newline);
  3. both signatures in signature.json (Ed25519 and ML-DSA-65) verify over the exact bytes of
     manifest.json, by keys in the given keyring, and each key id matches its key;
  4. every member's size and SHA-256 are what the manifest records, and nothing is added or missing.

(kbpc verify also demands the zip's headers be byte for byte the canonical form; a zip library
does not expose that, so this script leaves it out.)

    python3 verify_bundle.py model.kbp signing-key.pub.json [--export DIR]

--export DIR writes manifest.json, each signature (raw bytes) and each public key (PEM) into DIR,
for verifying with OpenSSL (see docs/bundle-format.md). Exit status 0: verified; 1: refused."""
import argparse
import base64
import hashlib
import json
import sys
import zipfile
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, mldsa

PUBLIC_KEY = {"ed25519": ed25519.Ed25519PublicKey.from_public_bytes,
              "ml-dsa-65": mldsa.MLDSA65PublicKey.from_public_bytes}


class Refused(Exception):
    pass


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def check_container(zf: zipfile.ZipFile) -> list[str]:
    names = [i.filename for i in zf.infolist()]
    if any(i.compress_type != zipfile.ZIP_STORED for i in zf.infolist()):
        raise Refused("an entry is compressed; every entry must be STORED")
    if names[-2:] != ["manifest.json", "signature.json"]:
        raise Refused("manifest.json and signature.json must be the last two entries, in that order")
    members = names[:-2]
    if members != sorted(set(members)):
        raise Refused("member entries are not sorted by path, or one occurs twice")
    return members


def check_signatures(raw_manifest: bytes, raw_signatures: bytes, keyring: list[dict]) -> list[str]:
    keys = {k["key_id"]: k for k in keyring}
    doc = json.loads(raw_signatures)
    if doc.get("suite") != "mldsa65+ed25519":
        raise Refused(f"unknown signature suite {doc.get('suite')!r}")
    seen = set()
    for entry in doc["signatures"]:
        alg, kid = entry["alg"], entry["key_id"]
        key = keys.get(kid)
        if key is None or key["alg"] != alg:
            raise Refused(f"the {alg} signature is by {kid}, which the keyring does not hold")
        raw_key = base64.b64decode(key["public_key"])
        if f"{alg}:{hashlib.sha256(raw_key).hexdigest()[:16]}" != kid:
            raise Refused(f"key id {kid} does not match its public key")
        try:
            PUBLIC_KEY[alg](raw_key).verify(base64.b64decode(entry["sig"]), raw_manifest)
        except InvalidSignature:
            raise Refused(f"the {alg} signature does not verify over manifest.json") from None
        seen.add(alg)
    if seen != set(PUBLIC_KEY):
        raise Refused("a bundle needs both an ed25519 and an ml-dsa-65 signature")
    return sorted(keys[e["key_id"]]["key_id"] for e in doc["signatures"])


def check_members(zf: zipfile.ZipFile, manifest: dict, members: list[str]) -> None:
    listed = {m["path"]: m for m in manifest["members"]}
    if set(listed) != set(members):
        raise Refused(f"members differ from the manifest: {sorted(set(listed) ^ set(members))[:5]}")
    for path, record in listed.items():
        digest, size = hashlib.sha256(), 0
        with zf.open(path) as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        if size != record["size"] or digest.hexdigest() != record["sha256"]:
            raise Refused(f"member {path} does not match the manifest")


def export(folder: Path, raw_manifest: bytes, raw_signatures: bytes, keyring: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_bytes(raw_manifest)
    for entry in json.loads(raw_signatures)["signatures"]:
        (folder / f"{entry['alg']}.sig").write_bytes(base64.b64decode(entry["sig"]))
    for key in keyring:
        pem = PUBLIC_KEY[key["alg"]](base64.b64decode(key["public_key"])).public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        (folder / f"{key['key_id'].replace(':', '-')}.pem").write_bytes(pem)


def verify(bundle: Path, keyring_path: Path, export_dir: Path | None = None) -> list[str]:
    keyring = json.loads(keyring_path.read_text())
    with zipfile.ZipFile(bundle) as zf:
        members = check_container(zf)
        raw_manifest, raw_signatures = zf.read("manifest.json"), zf.read("signature.json")
        manifest = json.loads(raw_manifest)
        if canonical(manifest) != raw_manifest:
            raise Refused("manifest.json is not canonical JSON")
        if export_dir is not None:
            export(export_dir, raw_manifest, raw_signatures, keyring)
        signers = check_signatures(raw_manifest, raw_signatures, keyring)
        check_members(zf, manifest, members)
    return signers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("keyring", type=Path)
    ap.add_argument("--export", type=Path, default=None)
    args = ap.parse_args()
    try:
        signers = verify(args.bundle, args.keyring, args.export)
    except (Refused, zipfile.BadZipFile, KeyError, ValueError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    print(f"verified {args.bundle}: signed by {', '.join(signers)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
