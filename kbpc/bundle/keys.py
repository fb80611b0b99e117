"""Signing keys: one Ed25519 and one ML-DSA-65 key pair per signer (a hybrid suite, so a bundle
stays trusted while either algorithm holds).

Key id: "<alg>:" + the first 16 hex digits of SHA-256 over the raw public key bytes.
Private key file (mode 0600): PKCS#8 PEM, optionally encrypted (kbpc/bundle/keyfile.py; the legacy
JSON form is still read).
Keyring file (mode 0644, JSON): a list of {"alg": "ed25519" | "ml-dsa-65", "key_id": ..., "public_key":
base64 of the raw public key}; it may hold the keys of many signers, and a bundle is trusted when
both of its signatures are by keys in it. Where key files live by default: kbpc/bundle/keystore.py.
"""
from __future__ import annotations

import base64
import json
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from cryptography.exceptions import InternalError, InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519, mldsa

from kbpc.bundle.keyfile import (LEGACY_FORMAT, KeyFileError, PrivateKey, check_key_item,
                                 decode_private, encode_pem, key_id)
from kbpc.bundle.manifest import ALGORITHMS, SignatureEntry
from kbpc.errors import KbpcWarning
from kbpc.settings import key_passphrase
from kbpc.util.atomic import atomic_writer, create_exclusive
from kbpc.util.jsonload import MB, parse_json, read_regular_file

MAX_KEY_FILE_BYTES = 64 << 10
MAX_KEYRING_BYTES = 16 * MB
_PUBLIC_CLASSES = {"ed25519": ed25519.Ed25519PublicKey, "ml-dsa-65": mldsa.MLDSA65PublicKey}

__all__ = ["KeyFileError", "Keyring", "PublicKey", "Signer", "key_id"]


@dataclass(frozen=True)
class PublicKey:
    alg: str
    key_id: str
    raw: bytes

    @classmethod
    def from_raw(cls, alg: str, raw: bytes) -> "PublicKey":
        try:
            _PUBLIC_CLASSES[alg].from_public_bytes(raw)  # ValueError on a malformed key
        except InternalError:   # OpenSSL refused the key material
            raise ValueError("OpenSSL rejects its key material") from None
        return cls(alg, key_id(alg, raw), raw)

    def verify(self, signature: bytes, data: bytes) -> bool:
        try:
            _PUBLIC_CLASSES[self.alg].from_public_bytes(self.raw).verify(signature, data)
        except InvalidSignature:
            return False
        return True

    def to_json(self) -> dict:
        return {"alg": self.alg, "key_id": self.key_id, "public_key": base64.b64encode(self.raw).decode("ascii")}


class Keyring:
    """Trusted public keys, by key id. `sources` names the files they came from (for messages)."""

    def __init__(self, keys: Iterable[PublicKey] = (), sources: Iterable[str] = ()):
        self._keys: dict[str, PublicKey] = {}
        for key in keys:
            self._keys[key.key_id] = key
        self.sources = tuple(sources)

    @classmethod
    def load(cls, path: Path) -> "Keyring":
        data = read_regular_file(path, MAX_KEYRING_BYTES, KeyFileError, "keyring")
        doc = None if data.lstrip().startswith(b"-----BEGIN") else \
            parse_json(data, str(path), error=KeyFileError, what="keyring", max_depth=4)
        if doc is None or (isinstance(doc, dict) and doc.get("format") == LEGACY_FORMAT):
            raise KeyFileError("this is a private key file, not a keyring; trust its public keyring "
                               "(the .pub.json beside it)", str(path))
        if not isinstance(doc, list):
            raise KeyFileError("a keyring must be a JSON list of {alg, key_id, public_key}", str(path))
        keys = []
        for i, item in enumerate(doc):
            where = f"{path}: [{i}]"
            alg, kid, raw = check_key_item(item, "public_key", where)
            try:
                key = PublicKey.from_raw(alg, raw)
            except ValueError as exc:
                raise KeyFileError(f"malformed {alg} public key: {exc}", where) from None
            if key.key_id != kid:
                raise KeyFileError(f"key_id {kid[:40]!r} does not match its public key ({key.key_id})", where)
            keys.append(key)
        return cls(keys, [str(path)])

    def merged(self, other: "Keyring") -> "Keyring":
        return Keyring([*self, *other], self.sources + other.sources)

    def get(self, kid: str) -> PublicKey | None:
        return self._keys.get(kid)

    def __iter__(self) -> Iterator[PublicKey]:
        return iter(self._keys.values())

    def __len__(self) -> int:
        return len(self._keys)

    def describe(self) -> str:
        return ", ".join(self.sources) if self.sources else "the given keyring"

    def to_bytes(self) -> bytes:
        return json.dumps([k.to_json() for k in self], indent=1).encode("utf-8") + b"\n"

    def save(self, path: Path) -> None:
        with atomic_writer(path, "wb", perms=0o644) as fh:
            fh.write(self.to_bytes())


class Signer:
    """A private Ed25519 + ML-DSA-65 key pair that signs manifests."""

    def __init__(self, ed25519_key: ed25519.Ed25519PrivateKey, mldsa_key: mldsa.MLDSA65PrivateKey,
                 source: str | None = None):
        self._keys: dict[str, PrivateKey] = {"ed25519": ed25519_key, "ml-dsa-65": mldsa_key}
        self.source = source
        self.public_keys = {alg: PublicKey.from_raw(alg, k.public_key().public_bytes_raw())
                            for alg, k in self._keys.items()}

    @classmethod
    def generate(cls) -> "Signer":
        return cls(ed25519.Ed25519PrivateKey.generate(), mldsa.MLDSA65PrivateKey.generate())

    @classmethod
    def load(cls, path: Path, passphrase: bytes | None = None) -> "Signer":
        """The signer in a private key file (PEM, or the legacy JSON form). The passphrase of an
        encrypted key: `passphrase`, else KBPC_SIGNING_KEY_PASSPHRASE. Warns when other users can
        read the file."""
        data = read_regular_file(path, MAX_KEY_FILE_BYTES, KeyFileError, "private key file")
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            warnings.warn(KbpcWarning(f"{path}: the private key file is readable or writable by other "
                                      f"users (mode {mode:04o}); `chmod 600 {path}` keeps it private"),
                          stacklevel=2)
        return cls.from_bytes(data, str(path), passphrase)

    @classmethod
    def from_bytes(cls, data: bytes, source: str, passphrase: bytes | None = None) -> "Signer":
        keys = decode_private(data, source, passphrase or key_passphrase())
        return cls(keys["ed25519"], keys["ml-dsa-65"], source)

    @property
    def key_ids(self) -> list[str]:
        return [self.public_keys[alg].key_id for alg in ALGORITHMS]

    def keyring(self) -> Keyring:
        return Keyring([self.public_keys[alg] for alg in ALGORITHMS])

    def sign(self, data: bytes) -> list[SignatureEntry]:
        return [SignatureEntry(alg, self.public_keys[alg].key_id, self._keys[alg].sign(data))
                for alg in ALGORITHMS]

    def to_pem(self, passphrase: bytes | None = None) -> bytes:
        return encode_pem([self._keys[alg] for alg in ALGORITHMS], passphrase)

    def save(self, path: Path, passphrase: bytes | None = None, replace: bool = True) -> bool:
        """Write the private key file (0600, atomically). With replace=False, only if no file has
        that name yet; returns whether this call wrote it."""
        if not replace:
            return create_exclusive(path, self.to_pem(passphrase), perms=0o600)
        with atomic_writer(path, "wb", perms=0o600) as fh:
            fh.write(self.to_pem(passphrase))
        return True
