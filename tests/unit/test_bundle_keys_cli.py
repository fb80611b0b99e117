"""Signing keys and keyrings, `kbpc keygen` / `sign` / `verify`, and the bundle report for
`kbpc inspect`."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, mldsa
from rich.console import Console

from kbpc.cli_bundle import keygen, sign, verify
from kbpc.bundle.container import Member, open_bundle, write_bundle
from kbpc.bundle.keys import KeyFileError, Keyring, Signer, key_id
from kbpc.bundle.keystore import default_key_dir, default_key_paths, ensure_default_key, generate_keys
from kbpc.errors import BundleError, KbpcWarning
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


def legacy_key_file(signer: Signer, path: Path) -> Path:
    """The private key in the legacy JSON form an older kbpc wrote (still read)."""
    path.write_text(json.dumps({"format": "kbpc-private-key/v1", "keys": [
        {"alg": alg, "key_id": signer.public_keys[alg].key_id,
         "private_key": base64.b64encode(signer._keys[alg].private_bytes_raw()).decode()}
        for alg in ("ed25519", "ml-dsa-65")]}))
    return path


def _corrupt(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _pem_blocks(path: Path) -> list[bytes]:
    return re.findall(rb"-----BEGIN [A-Z ]+-----\n.*?-----END [A-Z ]+-----\n", path.read_bytes(), re.DOTALL)


def test_private_key_is_pkcs8_pem(keys):
    blocks = _pem_blocks(keys.private)
    assert len(blocks) == 2 and all(b.startswith(b"-----BEGIN PRIVATE KEY-----") for b in blocks)
    loaded = [serialization.load_pem_private_key(b, None) for b in blocks]
    assert isinstance(loaded[0], ed25519.Ed25519PrivateKey) and isinstance(loaded[1], mldsa.MLDSA65PrivateKey)
    if shutil.which("openssl"):   # a standard file: OpenSSL reads it too
        out = subprocess.run(["openssl", "pkey", "-in", str(keys.private), "-pubout"], capture_output=True)
        assert out.returncode == 0 and b"BEGIN PUBLIC KEY" in out.stdout


@pytest.mark.parametrize("case, match", [
    ("missing", "not found"), ("garbage", "not a kbpc private key file"),
    ("keyring as key", "is a public keyring"), ("public pem", "not a private key"),
    ("damaged pem", "cannot load the private key"), ("one alg", "has no ml-dsa-65 key"),
    ("two ed25519", "holds two ed25519 keys"), ("directory", "is a directory"),
    ("fifo", "not a regular file"), ("huge", "at most 65536 are allowed"),
])
def test_bad_private_key_files(keys, tmp_path, case, match):
    path = keys.private
    blocks = _pem_blocks(path)
    if case == "missing":
        path = tmp_path / "nope.pem"
    elif case == "garbage":
        path.write_bytes(b"\x00\xff" * 10)
    elif case == "keyring as key":
        path = keys.public
    elif case == "public pem":
        pub = serialization.load_pem_private_key(blocks[0], None).public_key()
        path.write_bytes(pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    elif case == "damaged pem":
        path.write_bytes(blocks[0].replace(b"MC4C", b"MC4D") + blocks[1])
    elif case == "one alg":
        path.write_bytes(blocks[0])
    elif case == "two ed25519":
        path.write_bytes(blocks[0] * 2 + blocks[1])
    elif case == "directory":
        path = tmp_path
    elif case == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    elif case == "huge":
        path.write_bytes(b" " * (1 << 20))
    with pytest.raises(KeyFileError, match=match):
        Signer.load(path)


@pytest.mark.parametrize("case, match", [
    ("not json", "invalid JSON"), ("wrong format", "not a kbpc private key file"),
    ("bad base64", "not valid base64"), ("short key", "malformed ed25519 private key"),
    ("key id", "does not match its private key"), ("one alg", "has no ml-dsa-65 key"),
    ("alg list", "unknown algorithm"),
])
def test_legacy_json_keys_still_load_and_bad_ones_are_refused(keys, tmp_path, case, match):
    signer = Signer.load(keys.private)
    path = legacy_key_file(signer, tmp_path / "signing-key.json")
    path.chmod(0o600)
    assert Signer.load(path).key_ids == signer.key_ids
    if case == "not json":
        path.write_text("{")
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
    elif case == "alg list":
        _corrupt(path, lambda d: d["keys"][0].update(alg=["x"]))
    with pytest.raises(KeyFileError, match=match):
        Signer.load(path)


def test_encrypted_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("KBPC_SIGNING_KEY_PASSPHRASE", "correct horse")
    result = invoke(keygen, "-o", tmp_path / "k", "--encrypt")
    assert result.exit_code == 0 and "encrypted" in result.output, result.output
    path = tmp_path / "k" / "signing-key.pem"
    assert all(b.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") for b in _pem_blocks(path))
    signer = Signer.load(path)
    assert [k.key_id for k in Keyring.load(tmp_path / "k" / "signing-key.pub.json")] == signer.key_ids
    monkeypatch.setenv("KBPC_SIGNING_KEY_PASSPHRASE", "wrong")
    with pytest.raises(KeyFileError, match="wrong passphrase"):
        Signer.load(path)
    monkeypatch.delenv("KBPC_SIGNING_KEY_PASSPHRASE")
    with pytest.raises(KeyFileError, match="encrypted; set KBPC_SIGNING_KEY_PASSPHRASE"):
        Signer.load(path)
    refused = invoke(keygen, "-o", tmp_path / "k2", "--encrypt")   # no terminal, no passphrase
    assert refused.exit_code == 2 and "needs a passphrase" in refused.output


@pytest.mark.parametrize("case, match", [
    ("key as keyring", "private key file, not a keyring"), ("object", "must be a JSON list"),
    ("alg", "unknown algorithm 'rsa'"), ("key id", "does not match its public key"),
    ("short key", "malformed ml-dsa-65 public key"), ("fields", "exactly alg, key_id and public_key"),
    ("deep", "nests 100 levels deep"), ("legacy key as keyring", "private key file, not a keyring"),
])
def test_bad_keyrings(keys, tmp_path, case, match):
    path = keys.public
    if case == "key as keyring":
        path = keys.private
    elif case == "legacy key as keyring":
        path = legacy_key_file(Signer.load(keys.private), tmp_path / "old.json")
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
    elif case == "deep":
        path.write_text("[" * 100 + "]" * 100)
    with pytest.raises(KeyFileError, match=match):
        Keyring.load(path)


def test_default_key_created_once(config_home):
    assert default_key_dir().is_relative_to(config_home)
    with pytest.raises(KeyFileError, match="no signing key"):
        ensure_default_key(allow_create=False)
    assert not default_key_paths().private.exists()
    first = ensure_default_key(allow_create=True)
    path = first.path
    assert first.created and path == default_key_paths().private and path.exists()
    assert "created a signing key" in first.notes[0]
    again = ensure_default_key(allow_create=False)
    assert (again.path, again.created, again.notes) == (path, False, ())
    default_key_paths().public.unlink()  # a lost keyring is rebuilt from the private key, and said so
    rebuilt = ensure_default_key(allow_create=False)
    assert not rebuilt.created and "keyring" in rebuilt.notes[0] and "was missing" in rebuilt.notes[0]
    assert [k.key_id for k in Keyring.load(default_key_paths().public)] == Signer.load(path).key_ids
    # a keyring left by a process that lost the race to create the key is completed, not replaced
    stray = Signer.generate().keyring()
    stray.save(default_key_paths().public)
    assert ensure_default_key(allow_create=False).path == path
    held = {k.key_id for k in Keyring.load(default_key_paths().public)}
    assert held == {k.key_id for k in stray} | set(Signer.load(path).key_ids)


def test_legacy_default_key_is_still_used(config_home):
    signer = Signer.generate()
    default_key_dir().mkdir(parents=True)
    legacy_key_file(signer, default_key_dir() / "signing-key.json").chmod(0o600)
    key = ensure_default_key(allow_create=False)
    assert key.signer.key_ids == signer.key_ids and not key.created
    assert not default_key_paths().private.exists()


_RACE = """
from kbpc.bundle.keystore import ensure_default_key
print(",".join(ensure_default_key(allow_create=True).signer.key_ids))
"""


def test_concurrent_first_runs_agree_on_one_key(config_home):
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home)}
    procs = [subprocess.Popen([sys.executable, "-c", _RACE], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    ids = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(ids) == 1   # every process signs with the same key ...
    held = {k.key_id for k in Keyring.load(default_key_paths().public)}
    assert set(ids.pop().split(",")) <= held   # ... and the keyring trusts it
    assert [p.name for p in default_key_dir().iterdir() if p.name.endswith(".tmp")] == []


def test_world_readable_private_key_warns(keys):
    keys.private.chmod(0o644)
    with pytest.warns(KbpcWarning, match="readable or writable by other users"):
        Signer.load(keys.private)
    keys.private.chmod(0o600)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Signer.load(keys.private)


def test_file_modes(keys, bundle):
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(keys.private.stat().st_mode) == 0o600
    assert stat.S_IMODE(keys.public.stat().st_mode) == 0o644 & ~umask
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o644 & ~umask


def test_keygen_command(tmp_path, config_home):
    result = invoke(keygen, "-o", tmp_path / "k")
    assert result.exit_code == 0, result.output
    assert "signing-key.pem" in result.output and "ml-dsa-65:" in result.output
    again = invoke(keygen, "-o", tmp_path / "k")
    assert again.exit_code == 2 and "refusing to overwrite" in again.output
    assert invoke(keygen, "-o", tmp_path / "k", "--force").exit_code == 0
    assert invoke(keygen).exit_code == 0 and default_key_paths().private.exists()
    legacy_key_file(Signer.generate(), tmp_path / "k" / "signing-key.json")
    assert invoke(keygen, "-o", tmp_path / "k").exit_code == 2   # a legacy key counts as a key
    assert invoke(keygen, "-o", tmp_path / "k", "--force").exit_code == 0
    assert not (tmp_path / "k" / "signing-key.json").exists()


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


def test_sign_refuses_tampered_members_and_defaults_key(bundle, keys, config_home, monkeypatch):
    monkeypatch.setenv("CI", "true")
    before = bundle.read_bytes()
    refused = invoke(sign, bundle)  # no --key, no terminal, CI: no throwaway key
    assert refused.exit_code == 2 and "no signing key" in refused.output and "KBPC_SIGNING_KEY" in refused.output
    assert not default_key_paths().private.exists() and bundle.read_bytes() == before
    monkeypatch.setattr("kbpc.bundle.keystore.interactive", lambda: True)   # a person at a terminal
    result = invoke(sign, bundle)  # the default key, created now, and said so
    assert result.exit_code == 0 and "created a signing key" in result.output, result.output
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


def test_untrusted_reason_is_printed_as_text_not_markup(bundle, keys):
    """The reason an untrusted bundle gives quotes its own bytes: Rich markup in it ("[/]", found by
    the hostile-input fuzzer with seed 2436156236) is printed literally, never interpreted."""
    with open_bundle(bundle, Keyring.load(keys.public)) as b:
        s = summarize_bundle(b)
    s.update(trusted=False, untrusted_reason="signer [/] [bold]x[/bold] [link=file:///etc]y")
    console = Console(record=True, width=200)
    render_bundle_summary(s, console)
    assert "signer [/] [bold]x[/bold] [link=file:///etc]y" in console.export_text()


def test_key_material_openssl_rejects_is_a_clean_refusal(bundle, tmp_path):
    """A PKCS#8 block whose algorithm OID says X448 over a 32-byte key (one character of an Ed25519
    key's base64 changed; found by the hostile-input fuzzer with seed 777001): OpenSSL fails the key
    setup and cryptography raises InternalError, which kbpc refuses as a bad key file (exit 2)."""
    der = bytes.fromhex("302e020100300506032b656f04220420") + bytes(range(32))
    path = tmp_path / "x448.pem"
    path.write_text("-----BEGIN PRIVATE KEY-----\n" + base64.b64encode(der).decode() + "\n-----END PRIVATE KEY-----\n")
    result = invoke(sign, bundle, "--key", path, "-o", tmp_path / "out.kbp")
    assert result.exit_code == 2, result.output
    assert "OpenSSL rejects its key material" in result.output and "internal error" not in result.output
    assert not (tmp_path / "out.kbp").exists()


def test_signing_key_from_the_environment(bundle, keys, tmp_path, monkeypatch):
    """CI: the key comes from KBPC_SIGNING_KEY, as a file path or as the PEM text of a secret."""
    monkeypatch.setenv("CI", "true")
    signer = Signer.load(keys.private)
    for value in (str(keys.private), keys.private.read_text()):
        monkeypatch.setenv("KBPC_SIGNING_KEY", value)
        result = invoke(sign, bundle, "-o", tmp_path / "out.kbp")
        assert result.exit_code == 0, result.output
        with open_bundle(tmp_path / "out.kbp", Keyring.load(keys.public)) as b:
            assert b.signers == signer.key_ids
    assert not default_key_paths().private.exists()
    monkeypatch.setenv("KBPC_SIGNING_KEY", "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
    bad = invoke(sign, bundle)
    assert bad.exit_code == 2 and "$KBPC_SIGNING_KEY" in bad.output
