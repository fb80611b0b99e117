"""Signing keys: one Ed25519 and one ML-DSA-65 key pair per signer (a hybrid suite, so a bundle
stays trusted while either algorithm holds), a private key file and a public keyring file.

Key id: "<alg>:" + the first 16 hex digits of SHA-256 over the raw public key bytes.
Private key file (mode 0600): {"format": "kbpc-private-key/v1", "keys": [{alg, key_id, private_key}]}
with the raw private keys base64-encoded (the 32-byte Ed25519 key and the 32-byte ML-DSA-65 seed).
Keyring file: a JSON list of {alg, key_id, public_key}; it may hold the keys of many signers.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import platformdirs
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519, mldsa

from kbpc.bundle.manifest import ALGORITHMS, SignatureEntry, canonical_json
from kbpc.errors import KbpcError
from kbpc.util.atomic import atomic_writer

PRIVATE_FORMAT = "kbpc-private-key/v1"
PRIVATE_NAME = "signing-key.json"
PUBLIC_NAME = "signing-key.pub.json"

_PRIVATE_CLASSES = {"ed25519": ed25519.Ed25519PrivateKey, "ml-dsa-65": mldsa.MLDSA65PrivateKey}
_PUBLIC_CLASSES = {"ed25519": ed25519.Ed25519PublicKey, "ml-dsa-65": mldsa.MLDSA65PublicKey}


class KeyFileError(KbpcError):
    """A private key file or keyring is missing, unreadable, corrupt or of the wrong kind."""


def key_id(alg: str, public_raw: bytes) -> str:
    return f"{alg}:{hashlib.sha256(public_raw).hexdigest()[:16]}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: object, where: str) -> bytes:
    try:
        return base64.b64decode(str(text).encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise KeyFileError("not valid base64", where) from None


@dataclass(frozen=True)
class PublicKey:
    alg: str
    key_id: str
    raw: bytes

    @classmethod
    def from_raw(cls, alg: str, raw: bytes) -> "PublicKey":
        _PUBLIC_CLASSES[alg].from_public_bytes(raw)  # ValueError on a malformed key
        return cls(alg, key_id(alg, raw), raw)

    def verify(self, signature: bytes, data: bytes) -> bool:
        try:
            _PUBLIC_CLASSES[self.alg].from_public_bytes(self.raw).verify(signature, data)
        except InvalidSignature:
            return False
        return True

    def to_json(self) -> dict:
        return {"alg": self.alg, "key_id": self.key_id, "public_key": _b64(self.raw)}


def _read_json(path: Path, what: str) -> object:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KeyFileError(f"{what} not found", str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read {what}: {exc}", str(path)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise KeyFileError(f"{what} is not valid JSON: {exc}", str(path)) from None


def _check_item(item: object, secret_field: str, where: str) -> tuple[str, str, bytes]:
    if not isinstance(item, dict) or set(item) != {"alg", "key_id", secret_field}:
        raise KeyFileError(f"expected an object with exactly alg, key_id and {secret_field}", where)
    if item["alg"] not in ALGORITHMS:
        raise KeyFileError(f"unknown algorithm {item['alg']!r} (expected one of {', '.join(ALGORITHMS)})",
                           where)
    return item["alg"], item["key_id"], _unb64(item[secret_field], f"{where}.{secret_field}")


class Keyring:
    """Trusted public keys, by key id. `sources` names the files they came from (for messages)."""

    def __init__(self, keys: Iterable[PublicKey] = (), sources: Iterable[str] = ()):
        self._keys: dict[str, PublicKey] = {}
        for key in keys:
            self._keys[key.key_id] = key
        self.sources = tuple(sources)

    @classmethod
    def load(cls, path: Path) -> "Keyring":
        doc = _read_json(path, "keyring")
        if isinstance(doc, dict) and doc.get("format") == PRIVATE_FORMAT:
            raise KeyFileError("this is a private key file, not a keyring; trust its public keyring "
                               f"(the {PUBLIC_NAME} beside it)", str(path))
        if not isinstance(doc, list):
            raise KeyFileError("a keyring must be a JSON list of {alg, key_id, public_key}", str(path))
        keys = []
        for i, item in enumerate(doc):
            where = f"{path}: [{i}]"
            alg, kid, raw = _check_item(item, "public_key", where)
            try:
                key = PublicKey.from_raw(alg, raw)
            except ValueError as exc:
                raise KeyFileError(f"malformed {alg} public key: {exc}", where) from None
            if key.key_id != kid:
                raise KeyFileError(f"key_id {kid!r} does not match its public key ({key.key_id})", where)
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

    def save(self, path: Path) -> None:
        with atomic_writer(path, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(json.dumps([k.to_json() for k in self], indent=1).encode("utf-8") + b"\n")


class Signer:
    """A private Ed25519 + ML-DSA-65 key pair that signs manifests."""

    def __init__(self, ed25519_key: ed25519.Ed25519PrivateKey, mldsa_key: mldsa.MLDSA65PrivateKey,
                 source: str | None = None):
        self._keys = {"ed25519": ed25519_key, "ml-dsa-65": mldsa_key}
        self.source = source
        self.public_keys = {alg: PublicKey.from_raw(alg, k.public_key().public_bytes_raw())
                            for alg, k in self._keys.items()}

    @classmethod
    def generate(cls) -> "Signer":
        return cls(ed25519.Ed25519PrivateKey.generate(), mldsa.MLDSA65PrivateKey.generate())

    @classmethod
    def load(cls, path: Path) -> "Signer":
        doc = _read_json(path, "private key file")
        if isinstance(doc, list):
            raise KeyFileError("this is a public keyring, not a private key file (pass it to --trust)",
                               str(path))
        if not (isinstance(doc, dict) and doc.get("format") == PRIVATE_FORMAT
                and isinstance(doc.get("keys"), list)):
            raise KeyFileError(f"not a kbpc private key file (expected format {PRIVATE_FORMAT!r})", str(path))
        found = {}
        for i, item in enumerate(doc["keys"]):
            where = f"{path}: keys[{i}]"
            alg, kid, raw = _check_item(item, "private_key", where)
            try:
                key = (_PRIVATE_CLASSES[alg].from_private_bytes(raw) if alg == "ed25519"
                       else _PRIVATE_CLASSES[alg].from_seed_bytes(raw))
            except ValueError as exc:
                raise KeyFileError(f"malformed {alg} private key: {exc}", where) from None
            if key_id(alg, key.public_key().public_bytes_raw()) != kid:
                raise KeyFileError(f"key_id {kid!r} does not match its private key", where)
            if alg in found:
                raise KeyFileError(f"holds two {alg} keys", str(path))
            found[alg] = key
        missing = [alg for alg in ALGORITHMS if alg not in found]
        if missing:
            raise KeyFileError(f"has no {' or '.join(missing)} key; a signer needs both", str(path))
        return cls(found["ed25519"], found["ml-dsa-65"], str(path))

    @property
    def key_ids(self) -> list[str]:
        return [self.public_keys[alg].key_id for alg in ALGORITHMS]

    def keyring(self) -> Keyring:
        return Keyring([self.public_keys[alg] for alg in ALGORITHMS])

    def sign(self, data: bytes) -> list[SignatureEntry]:
        return [SignatureEntry(alg, self.public_keys[alg].key_id, self._keys[alg].sign(data))
                for alg in ALGORITHMS]

    def save(self, path: Path) -> None:
        # private_bytes_raw() of an ML-DSA-65 key is its 32-byte seed, which from_seed_bytes reloads
        doc = {"format": PRIVATE_FORMAT, "keys": [
            {"alg": alg, "key_id": self.public_keys[alg].key_id,
             "private_key": _b64(self._keys[alg].private_bytes_raw())}
            for alg in ALGORITHMS]}
        with atomic_writer(path, "wb") as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(canonical_json(doc))


@dataclass(frozen=True)
class KeyPairPaths:
    private: Path
    public: Path


def key_paths(directory: Path) -> KeyPairPaths:
    directory = Path(directory)
    return KeyPairPaths(directory / PRIVATE_NAME, directory / PUBLIC_NAME)


def generate_keys(directory: Path, overwrite: bool = False) -> KeyPairPaths:
    """Write a new signer's private key file (0600) and public keyring into `directory`.
    The keyring is written first: a private key file never exists without its keyring."""
    paths = key_paths(directory)
    if paths.private.exists() and not overwrite:
        raise KeyFileError("a private key already exists here; refusing to overwrite it", str(paths.private))
    signer = Signer.generate()
    signer.keyring().save(paths.public)
    signer.save(paths.private)
    return paths


def default_key_dir() -> Path:
    return Path(platformdirs.user_config_dir("kbpc")) / "keys"


def default_key_paths() -> KeyPairPaths:
    return key_paths(default_key_dir())


def ensure_default_key() -> tuple[Path, bool]:
    """(path of the default private key, whether it was created now). The default keyring is
    made to hold the key's public halves: rebuilt if lost, and completed if two processes raced
    to create the key (each writes its keyring, then its private key; the last private key wins)."""
    paths = default_key_paths()
    created = not paths.private.exists()
    if created:
        generate_keys(paths.private.parent, overwrite=True)
    signer = Signer.load(paths.private)
    ring = Keyring.load(paths.public) if paths.public.exists() else Keyring()
    if any(ring.get(kid) is None for kid in signer.key_ids):
        ring.merged(signer.keyring()).save(paths.public)
    return paths.private, created


def trusted_keyring(paths: Sequence[Path] = ()) -> Keyring:
    """The keyrings at `paths`, merged; with none, the default key's keyring (what --trust defaults to)."""
    if not paths:
        default = default_key_paths().public
        if not default.exists():
            raise KeyFileError("no --trust keyring given and no default keyring here; pass --trust "
                               "KEYRING (the signer's .pub.json) or create a key with `kbpc keygen`",
                               str(default))
        paths = (default,)
    keyring = Keyring()
    for path in paths:
        keyring = keyring.merged(Keyring.load(path))
    return keyring
