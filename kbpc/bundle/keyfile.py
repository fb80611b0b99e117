"""The private key file: bytes <-> one Ed25519 and one ML-DSA-65 private key.

Format (kbpc >= 0.1, written by `kbpc keygen`): a PEM file holding two PKCS#8 blocks, the Ed25519
key and the ML-DSA-65 key (in its 32-byte seed form), each `BEGIN PRIVATE KEY`, or `BEGIN
ENCRYPTED PRIVATE KEY` (PKCS#8 PBES2) when the key has a passphrase. `cryptography` 48
serializes both algorithms to PKCS#8 (ML-DSA in the seed form), so the file is a standard one:
`openssl pkey -in signing-key.pem` reads the Ed25519 block with any OpenSSL 3, the ML-DSA-65
block with OpenSSL 3.5 or later.

Legacy format (read, never written): the JSON object {"format": "kbpc-private-key/v1", "keys":
[{alg, key_id, private_key}]} with the raw private keys base64-encoded. Existing keys keep working;
`kbpc keygen` writes the PEM form.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import re

from cryptography.exceptions import InternalError, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, mldsa

from kbpc.errors import KbpcError
from kbpc.settings import PASSPHRASE_ENV
from kbpc.util.jsonload import parse_json

LEGACY_FORMAT = "kbpc-private-key/v1"
PRIVATE_CLASSES = {"ed25519": ed25519.Ed25519PrivateKey, "ml-dsa-65": mldsa.MLDSA65PrivateKey}
PrivateKey = ed25519.Ed25519PrivateKey | mldsa.MLDSA65PrivateKey
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]{1,40})-----\r?\n(.{1,4096}?)-----END \1-----", re.DOTALL)


class KeyFileError(KbpcError):
    """A private key file or keyring is missing, unreadable, corrupt or of the wrong kind."""


def key_id(alg: str, public_raw: bytes) -> str:
    """"<alg>:" + the first 16 hex digits of SHA-256 over the raw public key bytes."""
    return f"{alg}:{hashlib.sha256(public_raw).hexdigest()[:16]}"


def encode_pem(keys: list[PrivateKey], passphrase: bytes | None) -> bytes:
    encryption = (serialization.BestAvailableEncryption(passphrase) if passphrase
                  else serialization.NoEncryption())
    return b"".join(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    encryption) for k in keys)


def decode_private(data: bytes, source: str, passphrase: bytes | None) -> dict[str, PrivateKey]:
    """alg -> private key from a key file's bytes (PEM or legacy JSON); KeyFileError otherwise."""
    head = data.lstrip()[:1]
    if head == b"[":
        raise KeyFileError("this is a public keyring, not a private key file (pass it to --trust)", source)
    if head == b"{":
        return _decode_legacy(data, source)
    blocks = list(_PEM_BLOCK.finditer(data))
    if not blocks:
        raise KeyFileError("not a kbpc private key file (expected PEM private keys, or the legacy "
                           f"{LEGACY_FORMAT!r} JSON)", source)
    found: dict[str, PrivateKey] = {}
    for i, block in enumerate(blocks):
        label = block[1].decode("ascii")
        where = f"{source}: PEM block {i + 1} ({label})"
        if label not in ("PRIVATE KEY", "ENCRYPTED PRIVATE KEY"):
            raise KeyFileError("not a private key (a public key or certificate?)", where)
        key = _load_block(block[0], label == "ENCRYPTED PRIVATE KEY", passphrase, where)
        _add(found, alg_of(key), key, source)
    return _complete(found, source)


def alg_of(key: object) -> str | None:
    return next((alg for alg, cls in PRIVATE_CLASSES.items() if isinstance(key, cls)), None)


def _load_block(pem: bytes, encrypted: bool, passphrase: bytes | None, where: str) -> PrivateKey:
    if encrypted and not passphrase:
        raise KeyFileError(f"the key is encrypted; set {PASSPHRASE_ENV} to its passphrase", where)
    try:
        key = serialization.load_pem_private_key(pem, passphrase if encrypted else None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        why = "wrong passphrase or damaged key" if encrypted else str(exc).splitlines()[0][:120]
        raise KeyFileError(f"cannot load the private key: {why}", where) from None
    except InternalError:   # OpenSSL refused the key material (e.g. an X448 OID over 32 key bytes)
        raise KeyFileError("cannot load the private key: OpenSSL rejects its key material", where) from None
    if alg_of(key) is None:
        raise KeyFileError(f"a {type(key).__name__}; kbpc signs with Ed25519 and ML-DSA-65 keys", where)
    return key


def _add(found: dict[str, PrivateKey], alg: str, key: PrivateKey, source: str) -> None:
    if alg in found:
        raise KeyFileError(f"holds two {alg} keys", source)
    found[alg] = key


def _complete(found: dict[str, PrivateKey], source: str) -> dict[str, PrivateKey]:
    missing = [alg for alg in PRIVATE_CLASSES if alg not in found]
    if missing:
        raise KeyFileError(f"has no {' or '.join(missing)} key; a signer needs both", source)
    return found


def _decode_legacy(data: bytes, source: str) -> dict[str, PrivateKey]:
    doc = parse_json(data, source, error=KeyFileError, what="private key file", max_depth=4)
    if not (isinstance(doc, dict) and doc.get("format") == LEGACY_FORMAT and isinstance(doc.get("keys"), list)):
        raise KeyFileError(f"not a kbpc private key file (expected format {LEGACY_FORMAT!r})", source)
    found: dict[str, PrivateKey] = {}
    for i, item in enumerate(doc["keys"]):
        where = f"{source}: keys[{i}]"
        alg, kid, raw = check_key_item(item, "private_key", where)
        try:
            key = (ed25519.Ed25519PrivateKey.from_private_bytes(raw) if alg == "ed25519"
                   else mldsa.MLDSA65PrivateKey.from_seed_bytes(raw))
        except ValueError as exc:
            raise KeyFileError(f"malformed {alg} private key: {exc}", where) from None
        except InternalError:
            raise KeyFileError(f"malformed {alg} private key: OpenSSL rejects its key material", where) from None
        if key_id(alg, key.public_key().public_bytes_raw()) != kid:
            raise KeyFileError(f"key_id {kid!r} does not match its private key", where)
        _add(found, alg, key, source)
    return _complete(found, source)


def check_key_item(item: object, secret_field: str, where: str) -> tuple[str, str, bytes]:
    """(alg, key_id, raw bytes) of one {alg, key_id, <secret_field>} entry of a key file or keyring."""
    if not isinstance(item, dict) or set(item) != {"alg", "key_id", secret_field}:
        raise KeyFileError(f"expected an object with exactly alg, key_id and {secret_field}", where)
    if not isinstance(item["alg"], str) or item["alg"] not in PRIVATE_CLASSES:
        raise KeyFileError(f"unknown algorithm {str(item['alg'])[:40]!r} (expected one of "
                           f"{', '.join(PRIVATE_CLASSES)})", where)
    if not isinstance(item["key_id"], str) or not isinstance(item[secret_field], str):
        raise KeyFileError(f"key_id and {secret_field} must be strings", where)
    try:
        raw = base64.b64decode(item[secret_field].encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise KeyFileError("not valid base64", f"{where}.{secret_field}") from None
    return item["alg"], item["key_id"], raw
