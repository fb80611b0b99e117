"""The .kbp container: write a bundle (members, manifest, signatures) deterministically and
atomically; open one only after every check passes; re-sign one.

Entry order: the members sorted by path, then `manifest.json`, then `signature.json`. Members go
first so each is hashed while it streams into the file (the manifest needs every hash, and a
weights member can be far larger than memory); the signature goes last so re-signing rewrites
only the tail. Nothing is parsed from the manifest before both signatures over its exact bytes
verify against trusted keys, and nothing is read from a member before every member matches the
size and SHA-256 the signed manifest records.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from kbpc.bundle import zipfmt
from kbpc.bundle.keys import Keyring, Signer
from kbpc.bundle.manifest import (MANIFEST, SCHEMA, SIGNATURE, canonical_json, check_member_path,
                                  encode_signatures, parse_manifest, parse_signatures)
from kbpc.errors import BundleError
from kbpc.util.atomic import atomic_writer
from kbpc.util.jsonload import parse_json

_CHUNK = 1 << 20
_Note = Callable[[str], None]  # told each check as it passes
_MAX_MANIFEST_BYTES = 256 << 20


@dataclass(frozen=True)
class Member:
    """One file of the bundle: its bytes in memory (`data`) or a file streamed in chunks (`source`)."""

    path: str
    data: bytes | None = None
    source: Path | None = None


@dataclass
class VerifyReport:
    """What `verify_bundle` checked, in order, for `kbpc verify` to print."""

    path: Path
    checks: list[str] = field(default_factory=list)
    signers: list[str] = field(default_factory=list)
    members: int = 0
    total_bytes: int = 0


def _sorted_members(members: list[Member]) -> list[Member]:
    seen = set()
    for m in members:
        check_member_path(m.path)
        if m.path in seen:
            raise BundleError(f"member path {m.path!r} is given twice")
        seen.add(m.path)
        if (m.data is None) == (m.source is None):
            raise BundleError(f"member {m.path!r} needs exactly one of data and source")
    return sorted(members, key=lambda m: m.path)


def _file_chunks(fh: BinaryIO) -> Iterator[bytes]:
    while chunk := fh.read(_CHUNK):
        yield chunk


def _write_member(zw: zipfmt.ZipWriter, m: Member) -> dict:
    digest = hashlib.sha256()
    if m.data is not None:
        entry = zw.add(m.path, [m.data], len(m.data), on_chunk=digest.update)
    else:
        try:
            with open(m.source, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                entry = zw.add(m.path, _file_chunks(src), size, on_chunk=digest.update)
        except OSError as exc:
            raise BundleError(f"member {m.path!r}: cannot read {m.source}: {exc.strerror or exc}") from None
    return {"path": m.path, "size": entry.size, "sha256": digest.hexdigest()}


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[BinaryIO]:
    """atomic_writer, with the OS's refusals (no space, no permission, a directory in the way)
    reported as BundleError; the temporary file is gone either way."""
    try:
        with atomic_writer(Path(path), "wb") as fh:
            yield fh
    except OSError as exc:
        raise BundleError(f"cannot write: {exc.strerror or exc}", str(path)) from None


def write_bundle(out: Path, manifest: dict, members: list[Member], signer: Signer) -> dict:
    """Write a signed bundle to `out` atomically (a failure leaves no file) and return the final
    manifest: `manifest` plus `schema` and `members` ([{path, size, sha256}] sorted by path)."""
    manifest = dict(manifest)
    if manifest.setdefault("schema", SCHEMA) != SCHEMA:
        raise BundleError(f"manifest schema must be {SCHEMA!r}, not {manifest['schema']!r}")
    ordered = _sorted_members(members)
    try:  # before any member streams, not after
        canonical_json(manifest)
    except (TypeError, ValueError) as exc:
        raise BundleError(f"the manifest is not plain JSON: {exc}") from None
    with _writing(out) as fh:
        zw = zipfmt.ZipWriter(fh)
        manifest["members"] = [_write_member(zw, m) for m in ordered]
        raw = canonical_json(manifest)
        zw.add_bytes(MANIFEST, raw)
        zw.add_bytes(SIGNATURE, encode_signatures(signer.sign(raw)))
        zw.finish()
    return manifest


def _read_small(fh: BinaryIO, entry: zipfmt.Entry, limit: int) -> bytes:
    if entry.size > limit:
        raise BundleError(f"{entry.name} is {entry.size} bytes; at most {limit} are allowed")
    data = b"".join(zipfmt.iter_data(fh, entry))
    if zlib.crc32(data) != entry.crc:
        raise BundleError(f"zip entry {entry.name!r}: its CRC-32 does not match its data")
    return data


def _check_names(entries: list[zipfmt.Entry]) -> None:
    names = [e.name for e in entries]
    for reserved in (MANIFEST, SIGNATURE):
        if reserved not in names:
            raise BundleError(f"{reserved} is missing from the bundle")
    if names[-2:] != [MANIFEST, SIGNATURE]:
        raise BundleError(f"{MANIFEST} and {SIGNATURE} must be the last two zip entries, in that order")
    for name in names[:-2]:
        try:
            check_member_path(name)
        except BundleError as exc:
            raise BundleError(f"zip entry {name!r}: {exc}") from None
    if names[:-2] != sorted(set(names[:-2])):
        raise BundleError("zip entries are not sorted by path, or a path occurs twice")


class UntrustedError(BundleError):
    """The bundle is signed by a key the keyring does not hold (or the keyring is empty)."""


def _check_signatures(raw_manifest: bytes, raw_signatures: bytes, trust: Keyring, note: _Note) -> list[str]:
    if len(trust) == 0:
        raise UntrustedError("no trusted keys: the keyring is empty")
    signers = []
    for sig in parse_signatures(raw_signatures):
        key = trust.get(sig.key_id)
        if key is None:
            raise UntrustedError(f"the {sig.alg} signature is by key {sig.key_id}, which is not in the "
                                 f"trusted keyring ({trust.describe()})")
        if key.alg != sig.alg:
            raise BundleError(f"the {sig.alg} signature names key {sig.key_id}, a {key.alg} key")
        if not key.verify(sig.sig, raw_manifest):
            raise BundleError(f"the {sig.alg} signature by key {sig.key_id} does not verify over "
                              "manifest.json (the manifest or the signature was altered)")
        note(f"{sig.alg} signature by {sig.key_id}: valid, key trusted")
        signers.append(sig.key_id)
    return signers


def _check_members(fh: BinaryIO, manifest: dict, entries: list[zipfmt.Entry], note: _Note) -> None:
    in_zip = {e.name: e for e in entries[:-2]}
    listed = {m["path"]: m for m in manifest["members"]}
    for path in listed:
        if path not in in_zip:
            raise BundleError(f"member {path!r} listed in the signed manifest is missing from the bundle")
    for path in in_zip:
        if path not in listed:
            raise BundleError(f"zip entry {path!r} is not listed in the signed manifest (an added member)")
    for path, record in listed.items():
        entry = in_zip[path]
        if entry.size != record["size"]:
            raise BundleError(f"member {path!r} is {entry.size} bytes; the signed manifest records "
                              f"{record['size']}")
        digest, crc = hashlib.sha256(), 0
        for chunk in zipfmt.iter_data(fh, entry):
            digest.update(chunk)
            crc = zlib.crc32(chunk, crc)
        if digest.hexdigest() != record["sha256"]:
            raise BundleError(f"member {path!r} does not match the signed manifest: SHA-256 "
                              f"{digest.hexdigest()}, expected {record['sha256']} (altered or swapped)")
        if crc != entry.crc:
            raise BundleError(f"zip entry {path!r}: its CRC-32 does not match its data")
        note(f"member {path}: {entry.size} bytes, SHA-256 {record['sha256'][:16]}… matches")
    note(f"no unlisted members ({len(listed)} listed, {len(in_zip)} in the zip)")


@dataclass
class _Verified:
    entries: list[zipfmt.Entry]
    manifest_bytes: bytes
    manifest: dict
    signers: list[str]


def _verify(fh: BinaryIO, trust: Keyring | None, note: _Note) -> _Verified:
    """Every check, in order; `trust=None` skips the signatures (only for re-signing)."""
    entries = zipfmt.read_entries(fh, os.fstat(fh.fileno()).st_size)
    note(f"container: canonical zip, {len(entries)} entries, every entry STORED")
    _check_names(entries)
    note(f"{MANIFEST} and {SIGNATURE} present, entries in canonical order")
    raw_manifest = _read_small(fh, entries[-2], _MAX_MANIFEST_BYTES)
    signers = []
    if trust is not None:
        raw_signatures = _read_small(fh, entries[-1], 1 << 16)
        signers = _check_signatures(raw_manifest, raw_signatures, trust, note)
    manifest = parse_manifest(raw_manifest)
    note(f"manifest schema {SCHEMA}, canonical JSON, {len(manifest['members'])} members listed")
    _check_members(fh, manifest, entries, note)
    return _Verified(entries, raw_manifest, manifest, signers)


def _open_file(path: Path) -> BinaryIO:
    """The bundle file, unbuffered (every read sees the file as it is now); only a regular file
    (O_NONBLOCK: a FIFO named as a bundle is refused instead of waiting for a writer)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BundleError("no such bundle", str(path)) from None
    except OSError as exc:
        raise BundleError(f"cannot open bundle: {exc.strerror or exc}", str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BundleError("not a regular file (a directory, device, pipe or socket), so not a bundle",
                          str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb", buffering=0)


def _with_path(exc: BundleError, path: Path) -> BundleError:
    return exc if exc.where else type(exc)(exc.message, str(path))


class Bundle:
    """A verified bundle. Reads go through the file handle that was verified, and each read checks
    the member's SHA-256 again, so replacing or editing the file afterwards is caught."""

    def __init__(self, path: Path, fh: BinaryIO, verified: _Verified, trusted: bool = True):
        self.path = Path(path)
        self.trusted = trusted   # False: opened by open_untrusted, signatures not checked
        self._fh = fh
        self.size = os.fstat(fh.fileno()).st_size
        self._entries = {e.name: e for e in verified.entries}
        self.manifest_bytes = verified.manifest_bytes
        self.manifest = verified.manifest
        self.signers = verified.signers
        self._records = {m["path"]: m for m in self.manifest["members"]}

    @property
    def members(self) -> list[dict]:
        return list(self.manifest["members"])

    def _iter_checked(self, path: str) -> Iterator[bytes]:
        """The member's chunks; raises at once for an unknown path, and after the last chunk if the
        bytes no longer match the manifest."""
        record = self._records.get(path)
        if record is None:
            raise BundleError(f"no member {path!r} in the bundle", str(self.path))
        return self._chunks(path, record)

    def _chunks(self, path: str, record: dict) -> Iterator[bytes]:
        digest = hashlib.sha256()
        for chunk in zipfmt.iter_data(self._fh, self._entries[path]):
            digest.update(chunk)
            yield chunk
        if digest.hexdigest() != record["sha256"]:
            raise BundleError(f"member {path!r} changed on disk after the bundle was verified",
                              str(self.path))

    def iter_member(self, path: str) -> Iterator[bytes]:
        """A member's bytes in chunks, checked against the manifest as they stream (the check of the
        last chunk raises if anything differed); a large member is never held whole."""
        return self._iter_checked(path)

    def read(self, path: str) -> bytes:
        return b"".join(self._iter_checked(path))

    def read_json(self, path: str) -> Any:
        """A JSON member, parsed by the bounded loader (a signed bundle is still parsed with care)."""
        return parse_json(self.read(path), f"{self.path}:{path}", error=BundleError, what=path)

    def extract(self, path: str, dest_dir: Path) -> Path:
        """Write one member under `dest_dir` at its member path (atomically; nothing is left if the
        bytes no longer match the manifest)."""
        dest = Path(dest_dir).joinpath(*path.split("/"))
        chunks = self._iter_checked(path)
        with _writing(dest) as out:
            for chunk in chunks:
                out.write(chunk)
        return dest

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "Bundle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ignore(_check: str) -> None:
    pass


def _opened(path: Path, check: Callable[[BinaryIO], _Verified]) -> tuple[BinaryIO, _Verified]:
    """Open `path` and run `check` on it; the file is closed again if a check fails."""
    fh = _open_file(Path(path))
    try:
        return fh, check(fh)
    except BundleError as exc:
        fh.close()
        raise _with_path(exc, Path(path)) from None
    except BaseException:
        fh.close()
        raise


def open_bundle(path: Path, trust: Keyring, on_check: _Note | None = None) -> Bundle:
    """Verify the bundle at `path` against `trust`, then return it; any failed check raises
    BundleError naming the member, signature or key at fault. `on_check` hears each passed check."""
    fh, verified = _opened(path, lambda fh: _verify(fh, trust, on_check or _ignore))
    return Bundle(Path(path), fh, verified)


def open_untrusted(path: Path) -> Bundle:
    """Open a bundle whose signer is not trusted, for `kbpc inspect` to show: the container and
    every member are checked against the manifest, but the signatures cannot be, so nothing in it
    may be run. `signers` holds the key ids signature.json names (unverified)."""
    def check(fh: BinaryIO) -> _Verified:
        verified = _verify(fh, None, _ignore)
        raw = _read_small(fh, verified.entries[-1], 1 << 16)
        verified.signers = [sig.key_id for sig in parse_signatures(raw)]
        return verified

    fh, verified = _opened(path, check)
    return Bundle(Path(path), fh, verified, trusted=False)


def verify_bundle(path: Path, trust: Keyring, on_check: _Note | None = None) -> VerifyReport:
    """Run every check of `open_bundle`; return what was checked (raises BundleError on failure)."""
    report = VerifyReport(Path(path))

    def note(check: str) -> None:
        report.checks.append(check)
        if on_check is not None:
            on_check(check)

    with open_bundle(path, trust, note) as bundle:
        report.signers = list(bundle.signers)
        report.members = len(bundle.members)
        report.total_bytes = bundle.size
    return report


def resign_bundle(path: Path, signer: Signer, out: Path | None = None,
                  trust: Keyring | None = None) -> list[str]:
    """Replace the signatures of the bundle at `path` by `signer`'s, writing `out` (default: in
    place, atomically); every other byte stays the same. The members must still match the manifest;
    with `trust`, the old signatures must verify too. Returns the new signers' key ids."""
    path = Path(path)
    with _open_file(path) as fh:
        try:
            verified = _verify(fh, trust, _ignore)
        except BundleError as exc:
            raise _with_path(exc, path) from None
        with _writing(Path(out) if out else path) as dst:
            zw = zipfmt.ZipWriter(dst)
            records = {m["path"]: m for m in verified.manifest["members"]}
            for entry in verified.entries[:-2]:
                digest = hashlib.sha256()
                zw.add(entry.name, zipfmt.iter_data(fh, entry), entry.size, on_chunk=digest.update)
                if digest.hexdigest() != records[entry.name]["sha256"]:
                    raise BundleError(f"member {entry.name!r} changed while the bundle was re-signed",
                                      str(path))
            zw.add_bytes(MANIFEST, verified.manifest_bytes)
            zw.add_bytes(SIGNATURE, encode_signatures(signer.sign(verified.manifest_bytes)))
            zw.finish()
    return signer.key_ids
