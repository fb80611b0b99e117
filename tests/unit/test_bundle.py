"""The .kbp container: round trip, byte-for-byte determinism, and refusal of every kind of
tampering (a flipped byte anywhere, swapped/added/removed members, truncation, untrusted or
missing signatures, garbage signature.json) with a BundleError and nothing else."""
from __future__ import annotations

import base64
import json
import os
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbpc.bundle import zipfmt
from kbpc.bundle.container import Member, open_bundle, verify_bundle, write_bundle
from kbpc.bundle.keys import Keyring, Signer
from kbpc.bundle.manifest import canonical_json
from kbpc.errors import BundleError

MANIFEST = {"blueprint_id": "tiny", "plan_digest": "0" * 64, "target": "sm_90", "tp_size": 1,
            "toolchain": {"nvcc": "13.0", "flags": ["-O3", "--fmad=false"]}}


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer.generate()


@pytest.fixture(scope="module")
def trust(signer) -> Keyring:
    return signer.keyring()


def members(tmp: Path) -> list[Member]:
    big = tmp / "rank0.so"
    big.write_bytes(bytes(range(256)) * 5000 + b"tail")  # several read chunks
    return [Member("src/step.cu", b"// generated\n"), Member("graph.json", b'{"nodes": []}\n'),
            Member("lib/rank0.so", source=big), Member("weights/empty.bin", b"")]


def entries_of(path: Path) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(path) as zf:
        return [(info.filename, zf.read(info)) for info in zf.infolist()]


def forge(path: Path, entries: list[tuple[str, bytes]]) -> None:
    """A zip in the canonical layout with whatever entries a forger chooses (consistent CRCs)."""
    with open(path, "wb") as fh:
        zw = zipfmt.ZipWriter(fh)
        for name, data in entries:
            zw.add_bytes(name, data)
        zw.finish()


def refused(path: Path, trust: Keyring, match: str | None = None) -> BundleError:
    with pytest.raises(BundleError, match=match) as info:
        open_bundle(path, trust).close()
    return info.value


@pytest.fixture
def bundle(tmp_path, signer) -> Path:
    out = tmp_path / "model.kbp"
    write_bundle(out, MANIFEST, members(tmp_path), signer)
    return out


def test_round_trip(tmp_path, signer, trust, bundle):
    src = {m.path: m.data if m.data is not None else m.source.read_bytes() for m in members(tmp_path)}
    with open_bundle(bundle, trust) as b:
        assert [m["path"] for m in b.members] == sorted(src)
        assert b.manifest["schema"] == "kbp-bundle/v1" and b.manifest["target"] == "sm_90"
        assert b.signers == signer.key_ids
        for path, data in src.items():
            assert b.read(path) == data
        dest = b.extract("lib/rank0.so", tmp_path / "out")
        assert dest == tmp_path / "out" / "lib" / "rank0.so" and dest.read_bytes() == src["lib/rank0.so"]
        with pytest.raises(BundleError, match="no member 'nope'"):
            b.read("nope")
        with pytest.raises(BundleError, match="no member '../escape/x'"):
            b.extract("../escape/x", tmp_path / "out2")
        assert not (tmp_path / "escape").exists() and not (tmp_path / "out2").exists()
    # a standard zip: every entry STORED, 1980-01-01, mode 0644, no extra fields, CRCs right
    with zipfile.ZipFile(bundle) as zf:
        assert zf.testzip() is None
        infos = zf.infolist()
        assert [i.filename for i in infos] == sorted(src) + ["manifest.json", "signature.json"]
        for info in infos:
            assert info.compress_type == zipfile.ZIP_STORED and info.extra == b""
            assert info.date_time == (1980, 1, 1, 0, 0, 0)
            assert info.external_attr >> 16 == 0o100644
        raw = zf.read("manifest.json")
        assert raw == canonical_json(json.loads(raw)) and raw.endswith(b"\n")
        sig = json.loads(zf.read("signature.json"))
    assert sig["suite"] == "mldsa65+ed25519"
    assert [s["alg"] for s in sig["signatures"]] == ["ed25519", "ml-dsa-65"]
    assert [s["key_id"] for s in sig["signatures"]] == signer.key_ids


def test_verify_report_lists_every_check(bundle, trust):
    seen = []
    report = verify_bundle(bundle, trust, seen.append)
    assert report.checks == seen and report.members == 4 and report.total_bytes == bundle.stat().st_size
    text = "\n".join(report.checks)
    for needle in ("every entry STORED", "ed25519 signature by", "ml-dsa-65 signature by",
                   "kbp-bundle/v1", "member lib/rank0.so: 1280004 bytes", "no unlisted members"):
        assert needle in text


def test_deterministic_except_signature(tmp_path, signer):
    a, b = tmp_path / "a.kbp", tmp_path / "b.kbp"
    ms = members(tmp_path)
    write_bundle(a, MANIFEST, ms, signer)
    # same inputs in another order, the large member now given in memory: the same bytes
    write_bundle(b, dict(reversed(MANIFEST.items())),
                 [Member(m.path, m.data if m.data is not None else m.source.read_bytes())
                  for m in reversed(ms)],
                 signer)
    ea, eb = entries_of(a), entries_of(b)
    assert [n for n, _ in ea] == [n for n, _ in eb]
    assert [e for e in ea if e[0] != "signature.json"] == [e for e in eb if e[0] != "signature.json"]
    # everything before the signature entry is byte-identical, not just the member contents
    with zipfile.ZipFile(a) as zf:
        sig_offset = zf.getinfo("signature.json").header_offset
    assert a.read_bytes()[:sig_offset] == b.read_bytes()[:sig_offset]


def _sweep_positions(path: Path) -> list[int]:
    """Every byte outside signature.json's data; every 13th byte inside it (it is mostly base64)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("signature.json")
    start = info.header_offset + 30 + len(info.filename)
    size = path.stat().st_size
    return [i for i in range(size) if not start <= i < start + info.file_size or (i - start) % 13 == 0]


def test_any_flipped_byte_is_refused(tmp_path, signer, trust):
    good = tmp_path / "small.kbp"
    write_bundle(good, {"blueprint_id": "t"}, [Member("a.bin", b"\x00\x01" * 40), Member("lib/b.so", b"elf")],
                 signer)
    data = good.read_bytes()
    bad = tmp_path / "bad.kbp"
    for i in _sweep_positions(good):
        mutated = bytearray(data)
        mutated[i] ^= 0x01 if i % 2 else 0x80
        bad.write_bytes(mutated)
        with pytest.raises(BundleError):
            open_bundle(bad, trust).close()


@pytest.fixture(scope="module")
def small_bundle(tmp_path_factory, signer) -> tuple[Path, bytes]:
    d = tmp_path_factory.mktemp("hyp")
    write_bundle(d / "small.kbp", {"blueprint_id": "h"}, [Member("x/y.bin", os.urandom(300))], signer)
    return d, (d / "small.kbp").read_bytes()


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_random_byte_changes_are_refused(small_bundle, trust, data):
    d, good = small_bundle
    pos = data.draw(st.integers(0, len(good) - 1), label="position")
    xor = data.draw(st.integers(1, 255), label="xor")
    mutated = bytearray(good)
    mutated[pos] ^= xor
    (d / "bad.kbp").write_bytes(mutated)
    with pytest.raises(BundleError):
        open_bundle(d / "bad.kbp", trust).close()


@pytest.mark.parametrize("keep", [0, 1, 21, 22, 100, 0.5, -1, -22, -23, -100])
def test_truncated_is_refused(bundle, trust, keep):
    """`keep` bytes from the start: a count, a fraction of the file, or all but the last -keep."""
    data = bundle.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else len(data) + keep if keep < 0 else keep
    bundle.write_bytes(data[:n])
    refused(bundle, trust)


def test_trailing_bytes_are_refused(bundle, trust):
    bundle.write_bytes(bundle.read_bytes() + b"\0")
    refused(bundle, trust, "end-of-central-directory")


def test_swapped_member_is_refused(bundle, trust, tmp_path):
    entries = entries_of(bundle)
    swapped = [(n, b"// evil\n" if n == "src/step.cu" else d) for n, d in entries]
    forge(bundle, swapped)
    refused(bundle, trust, r"member 'src/step.cu' is 8 bytes; the signed manifest records 13")
    same_size = [(n, b"// EVIL code\n" if n == "src/step.cu" else d) for n, d in entries]
    forge(bundle, same_size)
    refused(bundle, trust, r"member 'src/step.cu' does not match the signed manifest: SHA-256")


def test_added_member_is_refused(bundle, trust):
    entries = entries_of(bundle)
    forge(bundle, sorted(entries[:-2] + [("lib/extra.so", b"x")]) + entries[-2:])
    refused(bundle, trust, r"zip entry 'lib/extra.so' is not listed in the signed manifest")
    forge(bundle, entries[:-2] + [("a_first.bin", b"x")] + entries[-2:])  # out of order
    refused(bundle, trust, "not sorted by path")
    forge(bundle, entries[:1] + entries[:-2] + entries[-2:])  # a duplicate entry
    refused(bundle, trust, "not sorted by path, or a path occurs twice")


def test_removed_member_is_refused(bundle, trust):
    entries = entries_of(bundle)
    forge(bundle, [e for e in entries if e[0] != "lib/rank0.so"])
    refused(bundle, trust, r"member 'lib/rank0.so' listed in the signed manifest is missing")
    for reserved in ("manifest.json", "signature.json"):
        forge(bundle, [e for e in entries if e[0] != reserved])
        refused(bundle, trust, f"{reserved} is missing")


def test_unknown_signer_is_refused(bundle, trust):
    other = Signer.generate().keyring()
    refused(bundle, other, r"the ed25519 signature is by key ed25519:[0-9a-f]{16}, which is not in the trusted")
    open_bundle(bundle, other.merged(trust)).close()  # a keyring may hold many signers
    refused(bundle, Keyring(), "no trusted keys")


def _replace_signatures(bundle: Path, edit) -> None:
    entries = entries_of(bundle)
    doc = json.loads(entries[-1][1])
    edit(doc)
    forge(bundle, entries[:-1] + [("signature.json", canonical_json(doc))])


@pytest.mark.parametrize("alg", ["ed25519", "ml-dsa-65"])
def test_one_valid_signature_is_not_enough(bundle, trust, alg):
    original = bundle.read_bytes()
    _replace_signatures(bundle, lambda d: d.update(signatures=[s for s in d["signatures"] if s["alg"] != alg]))
    refused(bundle, trust, f"signature.json has no {alg} signature")

    def corrupt(d):
        for s in d["signatures"]:
            if s["alg"] == alg:
                raw = bytearray(base64.b64decode(s["sig"]))
                raw[len(raw) // 2] ^= 1
                s["sig"] = base64.b64encode(bytes(raw)).decode()
    bundle.write_bytes(original)
    _replace_signatures(bundle, corrupt)
    refused(bundle, trust, f"the {alg} signature by key {alg}:[0-9a-f]{{16}} does not verify over manifest")

    # a valid signature from another (untrusted) key in place of the trusted one
    other = Signer.generate()
    manifest = dict(entries_of(Path(bundle)))["manifest.json"]
    fresh = {s.alg: s for s in other.sign(manifest)}[alg]
    bundle.write_bytes(original)
    fresh_json = {"key_id": fresh.key_id, "sig": base64.b64encode(fresh.sig).decode()}
    _replace_signatures(bundle, lambda d: [s.update(fresh_json) for s in d["signatures"] if s["alg"] == alg])
    refused(bundle, trust, f"the {alg} signature is by key {fresh.key_id}, which is not in the trusted keyring")


def test_manifest_edit_breaks_signatures(bundle, trust):
    entries = entries_of(bundle)
    manifest = json.loads(entries[-2][1])
    manifest["target"] = "sm_121"
    forge(bundle, entries[:-2] + [("manifest.json", canonical_json(manifest)), entries[-1]])
    refused(bundle, trust, "the ed25519 signature by key .* does not verify over manifest.json")


@pytest.mark.parametrize("garbage", [
    b"", b"\xff\xfe", b"not json", b"[]", b"{}", b'{"suite": "x", "signatures": []}',
    b'{"suite": "mldsa65+ed25519", "signatures": {}}',
    b'{"suite": "mldsa65+ed25519", "signatures": [1, 2]}',
    b'{"suite": "mldsa65+ed25519", "signatures": [{"alg": "rsa", "key_id": "k", "sig": ""}]}',
    b'{"suite": "mldsa65+ed25519", "signatures": [{"alg": "ed25519", "key_id": "k", "sig": "!!"}]}',
    b'{"suite": "mldsa65+ed25519", "signatures": [{"alg": "ed25519", "key_id": 3, "sig": "AA=="}]}',
    b" " * 70000,
], ids=lambda g: repr(g[:24]))
def test_garbage_signature_json_is_refused(bundle, trust, garbage):
    entries = entries_of(bundle)
    forge(bundle, entries[:-1] + [("signature.json", garbage)])
    refused(bundle, trust, "signature")


def test_duplicated_signature_is_refused(bundle, trust):
    _replace_signatures(bundle, lambda d: d["signatures"].append(d["signatures"][0]))
    refused(bundle, trust, "more than once")


def test_compressed_or_foreign_zip_is_refused(tmp_path, bundle, trust):
    foreign = tmp_path / "foreign.kbp"
    with zipfile.ZipFile(foreign, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries_of(bundle):
            zf.writestr(name, data)
    refused(foreign, trust, "is compressed .* must be STORED")
    with zipfile.ZipFile(foreign, "w", zipfile.ZIP_STORED) as zf:  # right data, non-canonical headers
        for name, data in entries_of(bundle):
            zf.writestr(name, data)
    refused(foreign, trust, "not in canonical form")
    for content, match in [(b"", "only 0 bytes"), (b"hello world" * 10, "not a zip file")]:
        foreign.write_bytes(content)
        refused(foreign, trust, match)
    refused(tmp_path / "missing.kbp", trust, "no such bundle")
    refused(tmp_path, trust, "not a regular file")


def test_read_rechecks_the_file(bundle, trust):
    with open_bundle(bundle, trust) as b:
        entry = next(e for e in zipfmt.read_entries(b._fh, b.size) if e.name == "src/step.cu")
        with open(bundle, "r+b") as fh:  # edited in place after verification
            fh.seek(entry.data_offset)
            fh.write(b"##")
        with pytest.raises(BundleError, match="changed on disk"):
            b.read("src/step.cu")
        with pytest.raises(BundleError, match="changed on disk"):
            b.extract("src/step.cu", bundle.parent / "x")
        assert not (bundle.parent / "x" / "src" / "step.cu").exists()


@pytest.mark.parametrize("bad", [
    [Member("../evil", b"")], [Member("/abs", b"")], [Member("a//b", b"")], [Member("a/./b", b"")],
    [Member("a\\b", b"")], [Member("manifest.json", b"")], [Member("signature.json", b"")],
    [Member("a", b""), Member("a", b"x")], [Member("a")], [Member("a", b"", Path("x"))],
    [Member("ok", b""), Member("src", source=Path("/nonexistent/file"))],
])
def test_failed_write_leaves_nothing(tmp_path, signer, bad):
    out = tmp_path / "out" / "model.kbp"
    with pytest.raises(BundleError):
        write_bundle(out, MANIFEST, bad, signer)
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_unwritable_output_is_a_bundle_error(tmp_path, signer):
    (tmp_path / "dir.kbp").mkdir()
    with pytest.raises(BundleError, match="cannot write"):
        write_bundle(tmp_path / "dir.kbp", MANIFEST, [Member("a", b"x")], signer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.kbp"]


def test_failed_write_keeps_the_old_file(bundle, signer):
    before = bundle.read_bytes()

    class Exploding(Signer):
        def sign(self, data):
            raise RuntimeError("HSM unplugged")
    exploding = Exploding.__new__(Exploding)
    exploding.__dict__.update(signer.__dict__)
    with pytest.raises(RuntimeError):
        write_bundle(bundle, MANIFEST, [Member("a", b"x")], exploding)
    with pytest.raises(BundleError, match="not plain JSON"):
        write_bundle(bundle, {"bad": {1, 2}}, [], signer)
    with pytest.raises(BundleError, match="schema"):
        write_bundle(bundle, {"schema": "kbp-bundle/v0"}, [], signer)
    assert bundle.read_bytes() == before
    assert [p.name for p in bundle.parent.iterdir() if p.suffix == ".tmp"] == []


def test_zip64_layout(tmp_path, signer, trust, monkeypatch):
    """Sizes, offsets and counts past the ZIP64 limits (lowered here so the test stays small)."""
    monkeypatch.setattr(zipfmt, "ZIP64_LIMIT", 500)
    monkeypatch.setattr(zipfmt, "ZIP64_COUNT_LIMIT", 4)
    out = tmp_path / "z64.kbp"
    ms = [Member("big.bin", bytes(range(256)) * 3), Member("small.txt", b"hi"),
          Member("z/after.bin", b"z" * 10)]
    write_bundle(out, MANIFEST, ms, signer)
    with open_bundle(out, trust) as b:
        assert [b.read(m.path) for m in ms] == [m.data for m in ms]
    with zipfile.ZipFile(out) as zf:  # the standard reader follows the ZIP64 fields
        assert zf.testzip() is None
        assert [zf.read(m.path) for m in ms] == [m.data for m in ms]
    data = out.read_bytes()
    for i in range(0, len(data), 3):
        mutated = bytearray(data)
        mutated[i] ^= 0x10
        out.write_bytes(mutated)
        with pytest.raises(BundleError):
            open_bundle(out, trust).close()


def test_canonical_json_is_stable():
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}\n'.encode()
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})
    assert canonical_json({}) == b"{}\n"
