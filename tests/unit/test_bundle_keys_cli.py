"""Signing keys and keyrings, `kbpc keygen` / `sign` / `verify`, and the bundle report for
`kbpc inspect`."""
from __future__ import annotations

import json
import stat
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from kbpc.cli_bundle import keygen, sign, verify
from kbpc.bundle.container import Member, open_bundle, write_bundle
from kbpc.bundle.keys import (KeyFileError, Keyring, Signer, default_key_dir, default_key_paths,
                              ensure_default_key, generate_keys, key_id)
from kbpc.errors import BundleError
from kbpc.report.inspect_bundle import render_bundle_summary, summarize_bundle

MANIFEST = {"blueprint_id": "tiny-bp", "plan_digest": "ab" * 32, "target": "sm_90", "tp_size": 3,
            "toolchain": {"nvcc": "13.0"}, "kind": "lite"}


@pytest.fixture(autouse=True)
def config_home(tmp_path, monkeypatch) -> Path:
    """Keep the default key out of the real home directory."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


def invoke(command, *args):
    return CliRunner().invoke(command, [str(a) for a in args])


@pytest.fixture
def keys(tmp_path):
    return generate_keys(tmp_path / "keys")


@pytest.fixture
def bundle(tmp_path, keys) -> Path:
    out = tmp_path / "model.kbp"
    write_bundle(out, MANIFEST, [Member("lib/rank0.so", b"\x7fELF" * 64), Member("src/a.cu", b"//"),
                                 Member("graph.json", b"{}")], Signer.load(keys.private))
    return out


def test_key_files_and_ids(keys):
    assert stat.S_IMODE(keys.private.stat().st_mode) == 0o600
    assert stat.S_IMODE(keys.public.stat().st_mode) == 0o644
    signer, ring = Signer.load(keys.private), Keyring.load(keys.public)
    assert [k.key_id for k in ring] == signer.key_ids
    for key in ring:
        assert key.key_id == key_id(key.alg, key.raw) and key.key_id.startswith(key.alg + ":")
        assert len(key.key_id.split(":")[1]) == 16
    sigs = signer.sign(b"message")
    assert all(ring.get(s.key_id).verify(s.sig, b"message") for s in sigs)
    assert not any(ring.get(s.key_id).verify(s.sig, b"messagE") for s in sigs)
    with pytest.raises(KeyFileError, match="refusing to overwrite"):
        generate_keys(keys.private.parent)
    assert generate_keys(keys.private.parent, overwrite=True) == keys
    assert Signer.load(keys.private).key_ids != signer.key_ids


def _corrupt(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("case, match", [
    ("missing", "not found"), ("not json", "not valid JSON"), ("keyring as key", "is a public keyring"),
    ("wrong format", "not a kbpc private key file"), ("bad base64", "not valid base64"),
    ("short key", "malformed ed25519 private key"), ("key id", "does not match its private key"),
    ("one alg", "has no ml-dsa-65 key"),
])
def test_bad_private_key_files(keys, tmp_path, case, match):
    path = keys.private
    if case == "missing":
        path = tmp_path / "nope.json"
    elif case == "not json":
        path.write_text("{")
    elif case == "keyring as key":
        path = keys.public
    elif case == "wrong format":
        _corrupt(path, lambda d: d.update(format="pem"))
    elif case == "bad base64":
        _corrupt(path, lambda d: d["keys"][0].update(private_key="@@"))
    elif case == "short key":
        _corrupt(path, lambda d: d["keys"][0].update(private_key="AAAA"))
    elif case == "key id":
        _corrupt(path, lambda d: d["keys"][1].update(key_id="ml-dsa-65:0000000000000000"))
    elif case == "one alg":
        _corrupt(path, lambda d: d.update(keys=d["keys"][:1]))
    with pytest.raises(KeyFileError, match=match):
        Signer.load(path)


@pytest.mark.parametrize("case, match", [
    ("key as keyring", "private key file, not a keyring"), ("object", "must be a JSON list"),
    ("alg", "unknown algorithm 'rsa'"), ("key id", "does not match its public key"),
    ("short key", "malformed ml-dsa-65 public key"), ("fields", "exactly alg, key_id and public_key"),
])
def test_bad_keyrings(keys, case, match):
    path = keys.public
    if case == "key as keyring":
        path = keys.private
    elif case == "object":
        path.write_text("{}")
    elif case == "alg":
        _corrupt(path, lambda d: d[0].update(alg="rsa"))
    elif case == "key id":
        _corrupt(path, lambda d: d[0].update(key_id="ed25519:0000000000000000"))
    elif case == "short key":
        _corrupt(path, lambda d: d[1].update(public_key="AAAA"))
    elif case == "fields":
        _corrupt(path, lambda d: d[0].update(comment="x"))
    with pytest.raises(KeyFileError, match=match):
        Keyring.load(path)


def test_default_key_created_once(config_home):
    assert default_key_dir().is_relative_to(config_home)
    path, created = ensure_default_key()
    assert created and path == default_key_paths().private and path.exists()
    assert ensure_default_key() == (path, False)
    default_key_paths().public.unlink()  # a lost keyring is rebuilt from the private key
    assert ensure_default_key() == (path, False)
    assert [k.key_id for k in Keyring.load(default_key_paths().public)] == Signer.load(path).key_ids
    # a keyring left by a process that lost the race to create the key is completed, not replaced
    stray = Signer.generate().keyring()
    stray.save(default_key_paths().public)
    assert ensure_default_key() == (path, False)
    held = {k.key_id for k in Keyring.load(default_key_paths().public)}
    assert held == {k.key_id for k in stray} | set(Signer.load(path).key_ids)


def test_keygen_command(tmp_path, config_home):
    result = invoke(keygen, "-o", tmp_path / "k")
    assert result.exit_code == 0, result.output
    assert "signing-key.json" in result.output and "ml-dsa-65:" in result.output
    again = invoke(keygen, "-o", tmp_path / "k")
    assert again.exit_code == 2 and "refusing to overwrite" in again.output
    assert invoke(keygen, "-o", tmp_path / "k", "--force").exit_code == 0
    assert invoke(keygen).exit_code == 0 and default_key_paths().private.exists()


def test_verify_command(bundle, keys, tmp_path):
    result = invoke(verify, bundle, "--trust", keys.public)
    assert result.exit_code == 0, result.output
    for needle in ("ok  container: canonical zip", "ok  ed25519 signature by", "ok  ml-dsa-65 signature by",
                   "ok  member lib/rank0.so", "verified", "3 members"):
        assert needle in result.output
    quiet = invoke(verify, bundle, "--trust", keys.public, "-q")
    assert quiet.exit_code == 0 and "ok  " not in quiet.output
    no_default = invoke(verify, bundle)
    assert no_default.exit_code == 2 and "no --trust keyring given" in no_default.output
    other = generate_keys(tmp_path / "other")
    untrusted = invoke(verify, bundle, "--trust", other.public)
    assert untrusted.exit_code == 3 and "not in the trusted keyring" in untrusted.output
    assert "Traceback" not in untrusted.output
    assert invoke(verify, bundle, "--trust", other.public, "--trust", keys.public).exit_code == 0
    data = bytearray(bundle.read_bytes())
    data[40] ^= 1  # inside the first member's data
    bundle.write_bytes(data)
    tampered = invoke(verify, bundle, "--trust", keys.public)
    assert tampered.exit_code == 3
    assert "member 'graph.json' does not match the signed manifest" in tampered.output


def _prefix_before_signature(path: Path) -> bytes:
    with zipfile.ZipFile(path) as zf:
        return path.read_bytes()[:zf.getinfo("signature.json").header_offset]


def test_sign_command_resigns_with_new_key(bundle, keys, tmp_path):
    new = generate_keys(tmp_path / "new")
    out = tmp_path / "resigned.kbp"
    result = invoke(sign, bundle, "--key", new.private, "-o", out, "--trust", keys.public)
    assert result.exit_code == 0, result.output
    assert ", ".join(Signer.load(new.private).key_ids) in result.output
    assert _prefix_before_signature(out) == _prefix_before_signature(bundle)
    with open_bundle(out, Keyring.load(new.public)) as b:
        assert b.signers == Signer.load(new.private).key_ids
    with pytest.raises(BundleError, match="not in the trusted keyring"):
        open_bundle(out, Keyring.load(keys.public))
    # in place, trusting only the new key for the old signatures: refused, file untouched
    before = bundle.read_bytes()
    refused = invoke(sign, bundle, "--key", new.private, "--trust", new.public)
    assert refused.exit_code == 3 and "not in the trusted keyring" in refused.output
    assert bundle.read_bytes() == before
    assert invoke(sign, bundle, "--key", new.private).exit_code == 0
    open_bundle(bundle, Keyring.load(new.public)).close()


def test_sign_refuses_tampered_members_and_defaults_key(bundle, keys, config_home):
    result = invoke(sign, bundle)  # no --key: the default key, created now
    assert result.exit_code == 0 and "created a default signing key" in result.output
    open_bundle(bundle, Keyring.load(default_key_paths().public)).close()
    data = bytearray(bundle.read_bytes())
    data[40] ^= 1
    bundle.write_bytes(data)
    tampered = invoke(sign, bundle, "--key", keys.private)
    assert tampered.exit_code == 3 and "does not match the signed manifest" in tampered.output
    assert bundle.read_bytes() == data
    wrong_key = invoke(sign, bundle, "--key", keys.public)
    assert wrong_key.exit_code == 2 and "is a public keyring" in wrong_key.output


def test_inspect_summary(bundle, keys):
    with open_bundle(bundle, Keyring.load(keys.public)) as b:
        s = summarize_bundle(b)
    assert (s["blueprint_id"], s["plan_digest"], s["target"], s["tp_size"], s["kind"]) == (
        "tiny-bp", "ab" * 32, "sm_90", 3, "lite")
    assert s["signers"] == Signer.load(keys.private).key_ids and s["lineage"] is None
    assert [(m["path"], m["size"]) for m in s["members"]] == [
        ("graph.json", 2), ("lib/rank0.so", 256), ("src/a.cu", 2)]
    assert s["total_member_bytes"] == 260 and s["file_bytes"] == bundle.stat().st_size
    assert s["by_directory"] == {".": {"files": 1, "bytes": 2}, "lib": {"files": 1, "bytes": 256},
                                 "src": {"files": 1, "bytes": 2}}
    console = Console(record=True, width=120)
    render_bundle_summary(s, console)
    text = console.export_text()
    for needle in ("tiny-bp", "sm_90", "lib/rank0.so", "nvcc=13.0", s["signers"][1]):
        assert needle in text
    json.dumps(s)  # the --json form
