"""The two JSON members every bundle carries: `manifest.json` (schema `kbp-bundle/v1`) and
`signature.json`, their canonical bytes, and the checks on member paths.

Manifest fields the compiler fills in (all optional to this module, which only owns `schema` and
`members`): `blueprint_id`, `lineage`, `revision`, `plan_digest`, `target`, `tp_size`,
`model_config`, `weights` (weight specs; a lite bundle names its checkpoint by hashes), `toolchain`
(versions and flags) and `kind` ("full" or "lite").
"""
from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from kbpc.errors import BundleError
from kbpc.util.jsonload import parse_json

SCHEMA = "kbp-bundle/v1"
MANIFEST = "manifest.json"
SIGNATURE = "signature.json"
RESERVED = (MANIFEST, SIGNATURE)
SUITE = "mldsa65+ed25519"
ALGORITHMS = ("ed25519", "ml-dsa-65")  # the order signature.json lists them in
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_SIGNATURE_BYTES = 1 << 16


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no insignificant whitespace, UTF-8, one trailing newline: one byte form per value."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8") + b"\n"


def check_member_path(path: object) -> str:
    """A member path is relative, POSIX, normalized (no '.', '..' or empty parts) and not reserved."""
    if not isinstance(path, str) or not path:
        raise BundleError(f"member path {path!r} must be a non-empty string")
    parts = path.split("/")
    if path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise BundleError(f"member path {path!r} must be relative and normalized "
                          "(forward slashes, no '.', '..' or empty parts)")
    if any(ord(c) < 0x20 or c == "\x7f" for c in path):
        raise BundleError(f"member path {path!r} holds a control character")
    if path in RESERVED:
        raise BundleError(f"member path {path!r} is reserved for the bundle's own metadata")
    if str(PurePosixPath(path)) != path:
        raise BundleError(f"member path {path!r} is not normalized")
    return path


def check_members_field(manifest: dict) -> list[dict]:
    """The signed manifest's member list: [{path, size, sha256}], sorted by path, unique."""
    members = manifest.get("members")
    if not isinstance(members, list):
        raise BundleError("manifest.json: 'members' must be a list")
    for i, m in enumerate(members):
        where = f"manifest.json: members[{i}]"
        if not isinstance(m, dict) or set(m) != {"path", "size", "sha256"}:
            raise BundleError(f"{where} must be an object with exactly path, size and sha256")
        check_member_path(m["path"])
        if type(m["size"]) is not int or m["size"] < 0:
            raise BundleError(f"{where} ({m['path']!r}): size must be a non-negative integer")
        if not isinstance(m["sha256"], str) or not _SHA256.fullmatch(m["sha256"]):
            raise BundleError(f"{where} ({m['path']!r}): sha256 must be 64 lowercase hex digits")
    paths = [m["path"] for m in members]
    if paths != sorted(set(paths)):
        raise BundleError("manifest.json: members must be sorted by path, each path once")
    return members


def parse_manifest(raw: bytes) -> dict:
    """Parse signed manifest bytes and check the schema and member list."""
    manifest = parse_json(raw, None, error=BundleError, what=MANIFEST)
    if not isinstance(manifest, dict):
        raise BundleError("manifest.json must hold a JSON object")
    if manifest.get("schema") != SCHEMA:
        raise BundleError(f"manifest.json: unsupported schema {manifest.get('schema')!r} "
                          f"(this kbpc reads {SCHEMA!r})")
    if canonical_json(manifest) != raw:
        raise BundleError("manifest.json is not in canonical JSON form")
    check_members_field(manifest)
    return manifest


@dataclass(frozen=True)
class SignatureEntry:
    alg: str
    key_id: str
    sig: bytes


def encode_signatures(entries: list[SignatureEntry]) -> bytes:
    by_alg = {e.alg: e for e in entries}
    return canonical_json({"suite": SUITE, "signatures": [
        {"alg": alg, "key_id": by_alg[alg].key_id, "sig": base64.b64encode(by_alg[alg].sig).decode("ascii")}
        for alg in ALGORITHMS]})


def _signature_entry(i: int, item: object) -> SignatureEntry:
    where = f"signature.json: signatures[{i}]"
    if not isinstance(item, dict) or set(item) != {"alg", "key_id", "sig"}:
        raise BundleError(f"{where} must be an object with exactly alg, key_id and sig")
    alg, key_id, sig = item["alg"], item["key_id"], item["sig"]
    if alg not in ALGORITHMS:
        raise BundleError(f"{where}: unknown algorithm {alg!r} (expected one of {', '.join(ALGORITHMS)})")
    if not isinstance(key_id, str) or not isinstance(sig, str):
        raise BundleError(f"{where}: key_id and sig must be strings")
    try:
        raw = base64.b64decode(sig.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise BundleError(f"{where} ({alg}): sig is not valid base64") from None
    return SignatureEntry(alg, key_id, raw)


def parse_signatures(raw: bytes) -> list[SignatureEntry]:
    """Parse signature.json strictly: the hybrid suite, exactly one signature per algorithm."""
    # Parsed before any signature is checked, so bounded like every other input (size, depth, ints).
    doc = parse_json(raw, None, error=BundleError, what=SIGNATURE, max_bytes=_MAX_SIGNATURE_BYTES,
                     max_depth=4)
    if not isinstance(doc, dict) or set(doc) != {"suite", "signatures"}:
        raise BundleError("signature.json must be an object with exactly 'suite' and 'signatures'")
    if doc["suite"] != SUITE:
        raise BundleError(f"signature.json: unsupported suite {doc['suite']!r} (expected {SUITE!r})")
    if not isinstance(doc["signatures"], list):
        raise BundleError("signature.json: 'signatures' must be a list")
    entries = [_signature_entry(i, item) for i, item in enumerate(doc["signatures"])]
    algs = [e.alg for e in entries]
    for alg in ALGORITHMS:
        if alg not in algs:
            raise BundleError(f"signature.json has no {alg} signature; a bundle needs both "
                              f"{' and '.join(ALGORITHMS)} signatures")
    if len(algs) != len(ALGORITHMS):
        raise BundleError("signature.json lists an algorithm more than once")
    return sorted(entries, key=lambda e: ALGORITHMS.index(e.alg))
