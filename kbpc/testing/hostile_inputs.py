"""Inputs for the hostile-input campaign (kbpc/testing/hostile.py): a valid fixture (keys, a signed
bundle holding the tiny blueprint, a config, a keyring) and the ways to damage each part: byte
flips, cuts and insertions, JSON values replaced by hostile ones, and raw hostile payloads (deep
nesting, 5,000-digit numbers, NaN, lone surrogates, duplicate keys, huge strings)."""
from __future__ import annotations

import base64
import copy
import dataclasses
import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kbpc.bundle import zipfmt
from kbpc.bundle.container import Member, write_bundle
from kbpc.bundle.keys import Signer
from kbpc.bundle.keystore import KeyPairPaths, generate_keys
from kbpc.bundle.manifest import MANIFEST, SIGNATURE, canonical_json, encode_signatures
from kbpc.codegen.records import StepProgram

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.graph.json"

# Raw JSON texts no well-formed input holds.
PAYLOADS = [
    b"[" * 60000, b"{\"a\":" * 3000 + b"1" + b"}" * 3000, b"1" * 5000, b"-" + b"9" * 400, b"NaN",
    b"[Infinity]", b"[1e999]", b'["\\ud800"]', b'{"\\udfff": 1}', b'{"a": 1, "a": 2}', b"", b"null",
    b"\xff\xfe\x00", b'"' + b"x" * (2 << 20) + b'"', b"[" + b"0," * 200000 + b"0]", b"{}", b"[]",
    b"\x00" * 64, b'{"schema": "kbp-bundle/v1"}', b"PK\x03\x04" + b"\x00" * 100,
]
HOSTILE_STRINGS = ['"; system("id"); //', "\n#define x", "*/", "\\", "??/", "\x1b[31mred", "\u2028",
                   "a" * 100000, "", "../../etc/passwd", "\x00", "[bold]rich[/bold]", "[/]", "n/2",
                   "hidden*" * 300 + "1", "%s%n", "\ud800"]


def hostile_value(rng: random.Random) -> Any:
    """A JSON-able (or nearly: NaN, surrogates) value of the wrong kind or size."""
    return rng.choice([
        None, True, False, 0, -1, 2**31, 2**40, 2**63, -(2**63) - 1, 10**30, 1.5, float("nan"),
        float("inf"), -0.0, 1e308, rng.choice(HOSTILE_STRINGS), [], {}, [None] * 3,
        {"": None}, [[[[[]]]]], list(range(50)), {"k": rng.choice(HOSTILE_STRINGS)},
    ])


def _paths(doc: Any, limit: int = 200000) -> list[tuple]:
    """Every (key path) in `doc`, breadth first, at most `limit`."""
    out, queue = [], [((), doc)]
    while queue and len(out) < limit:
        path, value = queue.pop()
        out.append(path)
        if isinstance(value, dict):
            queue.extend((path + (k,), v) for k, v in value.items())
        elif isinstance(value, list):
            queue.extend((path + (i,), v) for i, v in enumerate(value))
    return out


def mutate_doc(doc: Any, rng: random.Random, edits: int | None = None) -> Any:
    """A deep copy of `doc` with 1-3 edits: a value replaced by a hostile one, a key deleted, a
    list item dropped or duplicated, or a string swapped for a hostile string."""
    doc = copy.deepcopy(doc)
    paths = [p for p in _paths(doc) if p]
    for _ in range(edits or rng.randint(1, 3)):
        if not paths:
            return hostile_value(rng)
        path = rng.choice(paths)
        parent = doc
        try:
            for step in path[:-1]:
                parent = parent[step]
            key = path[-1]
            value = parent[key]
        except (KeyError, IndexError, TypeError):
            continue   # an earlier edit removed it
        if not isinstance(parent, (dict, list)):
            continue   # an earlier edit replaced a container on the way by a string
        op = rng.choice(["value", "value", "string", "delete", "duplicate"])
        if isinstance(value, str) and rng.random() < 0.5:
            op = "string"
        if op == "delete":
            del parent[key]
        elif op == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(value))
        elif op == "string" and isinstance(value, str):
            parent[key] = rng.choice(HOSTILE_STRINGS)
        else:
            parent[key] = hostile_value(rng)
    return doc


def payload(doc: Any, rng: random.Random) -> bytes:
    """`doc` as JSON text, sometimes replaced by one of the raw hostile payloads."""
    if rng.random() < 0.15:
        return rng.choice(PAYLOADS)
    try:
        return json.dumps(doc, indent=rng.choice([None, 1])).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError, RecursionError):
        return rng.choice(PAYLOADS)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """`data` with a few bytes flipped, a cut, an insertion, a copied span, or a hostile payload."""
    data = bytearray(data)
    op = rng.choice(["flip", "flip", "cut", "insert", "copy", "zero", "payload"])
    if op == "flip" or not data:
        for _ in range(rng.randint(1, 8)):
            if data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif op == "cut":
        del data[rng.randrange(len(data)):]
    elif op == "insert":
        at = rng.randrange(len(data))
        data[at:at] = rng.choice([b"\x00" * rng.randint(1, 64), b"[" * 1000, b"PK\x05\x06", b"\xff" * 8])
    elif op == "copy":
        a = rng.randrange(len(data))
        b = min(len(data), a + rng.randint(1, 4096))
        at = rng.randrange(len(data))
        data[at:at] = data[a:b]
    elif op == "zero":
        a = rng.randrange(len(data))
        data[a:a + rng.randint(1, 256)] = bytes(min(len(data) - a, 256))
    else:
        return rng.choice(PAYLOADS)
    return bytes(data)


def special_file(out: Path, rng: random.Random) -> bool:
    """Sometimes (5%) make `out` a FIFO with no writer, a link to /dev/zero, or a directory:
    inputs that are not regular files. Returns whether it did."""
    if rng.random() >= 0.05:
        return False
    kind = rng.choice(["fifo", "zero", "dir"])
    if kind == "fifo":
        os.mkfifo(out)
    elif kind == "zero" and Path("/dev/zero").exists():
        out.symlink_to("/dev/zero")
    else:
        out.mkdir()
    return True


@dataclass
class Fixture:
    keys: KeyPairPaths
    signer: Signer
    graph_path: Path
    graph_bytes: bytes
    graph_doc: dict
    bundle_path: Path
    bundle_bytes: bytes
    members: dict[str, bytes]
    manifest_doc: dict
    signature_doc: dict
    config_doc: dict
    key_bytes: bytes
    legacy_key_doc: dict
    keyring_bytes: bytes
    keyring_doc: list

    @classmethod
    def build(cls, root: Path) -> "Fixture":
        keys = generate_keys(root / "keys")
        signer = Signer.load(keys.private)
        graph = TINY.read_bytes()
        members = {"graph.json": graph, "plan.json": b"{}\n", "lib/rank0/libkbp.so": b"\x7fELF" + bytes(252),
                   "src/step.cu": b"// generated\n"}
        manifest = {"kind": "lite", "blueprint_id": "tiny", "plan_digest": "ab" * 32, "target": "sm_90",
                    "tp_size": 1, "toolchain": {"nvcc": "13.0"}, "library": {"rank0": "lib/rank0/libkbp.so"},
                    "model_config": {"symbols": {}, "constants": {}}}
        bundle = root / "base.kbp"
        final = write_bundle(bundle, manifest, [Member(p, d) for p, d in members.items()], signer)
        signature = json.loads(_signature_bytes(bundle))
        legacy = {"format": "kbpc-private-key/v1", "keys": [
            {"alg": alg, "key_id": signer.public_keys[alg].key_id,
             "private_key": base64.b64encode(signer._keys[alg].private_bytes_raw()).decode()}
            for alg in ("ed25519", "ml-dsa-65")]}
        return cls(keys, signer, TINY, graph, json.loads(graph), bundle, bundle.read_bytes(), members,
                   final, signature, {"symbols": {"q_heads": 2}, "constants": {"swiglu_limit": 7.0}},
                   keys.private.read_bytes(), legacy, keys.public.read_bytes(),
                   json.loads(keys.public.read_bytes()))


def _signature_bytes(bundle: Path) -> bytes:
    with open(bundle, "rb") as fh:
        entries = zipfmt.read_entries(fh, bundle.stat().st_size)
        return b"".join(zipfmt.iter_data(fh, entries[-1]))


def forge_bundle(out: Path, fx: Fixture, members: dict[str, bytes] | None = None,
                 manifest: bytes | None = None, signature: bytes | None = None, sign: bool = False) -> None:
    """A canonical zip with the fixture's members (some replaced), a manifest (re-derived when
    members change, or given raw), and a signature (given raw, re-made by the fixture's trusted
    signer with `sign`, or the original one)."""
    files = {**fx.members, **(members or {})}
    if manifest is None:
        doc = dict(fx.manifest_doc)
        doc["members"] = [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for p, d in sorted(files.items())]
        manifest = canonical_json(doc)
    if signature is None:
        signature = encode_signatures(fx.signer.sign(manifest)) if sign or members else \
            canonical_json(fx.signature_doc)
    with open(out, "wb") as fh:
        zw = zipfmt.ZipWriter(fh)
        for path, data in sorted(files.items()):
            zw.add_bytes(path, data)
        zw.add_bytes(MANIFEST, manifest)
        zw.add_bytes(SIGNATURE, signature)
        zw.finish()


def step_with_text(step: StepProgram, text: Callable[[str], str]) -> StepProgram:
    """`step` with every text field the templates render replaced by text(field name): the blueprint
    id, plan digest, command and target, and each group's rule, family and node ids, each launch's
    node ids and each kernel instance's family."""
    groups = tuple(dataclasses.replace(
        g, rule=text("rule"), family=text("family"), nodes=tuple(text("node") for _ in g.nodes),
        launches=tuple(dataclasses.replace(l, nodes=tuple(text("lnode") for _ in l.nodes),
                                           instance=dataclasses.replace(l.instance, family=text("ifam")))
                       for l in g.launches))
        for g in step.groups)
    instances = tuple(dataclasses.replace(i, family=text("ifam")) for i in step.instances)
    return dataclasses.replace(step, blueprint_id=text("bid"), plan_digest=text("digest"),
                               command=text("command"), target=text("target"), groups=groups,
                               instances=instances)
