"""Where signing keys live and how kbpc finds or creates one.

A key directory holds `signing-key.pem` (the private key, 0600), `signing-key.pub.json` (its
keyring, 0644) and `.lock`. The default directory is `<user config dir>/kbpc/keys`; an older kbpc
wrote `signing-key.json` there, which is still used when no .pem exists.

Which key signs (`compile`, `sign`): `--key FILE`; else KBPC_SIGNING_KEY (a key file path or the PEM
text itself, e.g. a CI secret); else the default key. The default key is created on first use only
when a person runs kbpc at a terminal (stdin a TTY, CI unset); in CI or a pipeline kbpc refuses
instead of signing with a throwaway key. `kbpc run BLUEPRINT` on a GPU compiles into the user
cache and may create the default key anywhere: that bundle never leaves the machine.

Concurrent first runs are safe: every change to a key directory holds an exclusive lock on its
`.lock` (fcntl), the private key is written aside and linked into place only if the name is free,
and the keyring is completed (never replaced) with the key's public halves. A missing keyring is
rebuilt with a note saying so; a private key readable by other users is used with a warning.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import platformdirs

from kbpc.bundle.keyfile import KeyFileError
from kbpc.bundle.keys import Keyring, Signer
from kbpc.settings import SIGNING_KEY_ENV, interactive, signing_key_from_env

PRIVATE_NAME = "signing-key.pem"
LEGACY_PRIVATE_NAME = "signing-key.json"
PUBLIC_NAME = "signing-key.pub.json"
LOCK_NAME = ".lock"
NO_KEY = (f"no signing key: kbpc creates a default key only for a person at a terminal (CI unset); "
          f"pass --key KEY, or set {SIGNING_KEY_ENV} to a private key file or its PEM text (e.g. from a "
          "CI secret); `kbpc keygen` creates a key")


@dataclass(frozen=True)
class KeyPairPaths:
    private: Path
    public: Path

    @property
    def legacy(self) -> Path:
        return self.private.with_name(LEGACY_PRIVATE_NAME)

    def existing_private(self) -> Path | None:
        """The private key file in use here: the PEM one, else a legacy JSON one, else None."""
        return next((p for p in (self.private, self.legacy) if p.exists()), None)


@dataclass(frozen=True)
class DefaultKey:
    path: Path
    signer: Signer
    created: bool
    notes: tuple[str, ...] = field(default=())


def key_paths(directory: Path) -> KeyPairPaths:
    directory = Path(directory)
    return KeyPairPaths(directory / PRIVATE_NAME, directory / PUBLIC_NAME)


def default_key_dir() -> Path:
    return Path(platformdirs.user_config_dir("kbpc")) / "keys"


def default_key_paths() -> KeyPairPaths:
    return key_paths(default_key_dir())


@contextlib.contextmanager
def key_dir_lock(directory: Path) -> Iterator[None]:
    """Hold the directory's exclusive lock; OS refusals (read-only, not a folder) are KeyFileError."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = _lock_file(directory)
    except OSError as exc:
        raise KeyFileError(f"cannot use the key folder: {exc.strerror or exc}", str(directory)) from None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        except OSError as exc:
            raise KeyFileError(f"cannot write a key file: {exc.strerror or exc}", str(directory)) from None
    finally:
        if fd is not None:
            os.close(fd)   # releases the lock


def _lock_file(directory: Path) -> int | None:
    """The lock file's descriptor; in a read-only key folder an existing lock file opened for
    reading (flock needs no write access), or None when there is none: nothing can be written
    there anyway, and a write fails with a clear error."""
    try:
        return os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        if not directory.is_dir():
            raise
    try:
        return os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def generate_keys(directory: Path, overwrite: bool = False, passphrase: bytes | None = None) -> KeyPairPaths:
    """A new signer's private key file (0600, encrypted with `passphrase` if given) and keyring
    (holding only its keys) in `directory`. The keyring is written first: a private key file
    never exists without its keyring."""
    paths = key_paths(directory)
    with key_dir_lock(directory):
        if paths.existing_private() and not overwrite:
            raise KeyFileError("a private key already exists here; refusing to overwrite it",
                               str(paths.existing_private()))
        signer = Signer.generate()
        signer.keyring().save(paths.public)
        if not signer.save(paths.private, passphrase, replace=overwrite):
            raise KeyFileError("another process created a private key here just now", str(paths.private))
        if overwrite:
            paths.legacy.unlink(missing_ok=True)
    return paths


def ensure_default_key(allow_create: bool) -> DefaultKey:
    """The default signer, its keyring completed with its public keys. Created now only if
    `allow_create` (else KeyFileError); `notes` says what was created or repaired."""
    paths = default_key_paths()
    with key_dir_lock(paths.private.parent):
        existing = paths.existing_private()
        notes: list[str] = []
        if existing is None:
            if not allow_create:
                raise KeyFileError(NO_KEY, str(paths.private))
            signer = Signer.generate()
            _complete_keyring(paths, signer, notes)   # first, as generate_keys does
            if signer.save(paths.private, replace=False):
                notes.append(f"created a signing key: {paths.private} (public keyring beside it: {paths.public})")
                return DefaultKey(paths.private, signer, True, tuple(notes))
            existing = paths.private   # a process outside the lock won the race: use its key
        signer = Signer.load(existing)
        _complete_keyring(paths, signer, notes)
    return DefaultKey(existing, signer, False, tuple(notes))


def _complete_keyring(paths: KeyPairPaths, signer: Signer, notes: list[str]) -> None:
    """Add the signer's public keys to the keyring beside it (never dropping others)."""
    if paths.public.exists():
        ring = Keyring.load(paths.public)
    else:
        ring = Keyring()
        if paths.existing_private() is not None:
            notes.append(f"the default keyring {paths.public} was missing: rebuilt it with the default key's "
                         "public keys only (any other keys you had trusted there are not restored)")
    if any(ring.get(kid) is None for kid in signer.key_ids):
        ring.merged(signer.keyring()).save(paths.public)


def signing_key(key_path: Path | None, allow_create: bool,
                on_note: Callable[[str], None]) -> Signer | Callable[[], Signer]:
    """The signer for `compile` / `sign`: `--key`, else KBPC_SIGNING_KEY, else the default key.
    When the default key must be created first, a function that creates it: the caller calls it
    once its input is checked, so a bad input never leaves a new key behind."""
    if key_path is not None:
        return Signer.load(key_path)
    from_env = signing_key_from_env()
    if from_env is not None:
        if from_env.lstrip().startswith(("-----BEGIN", "{")):
            return Signer.from_bytes(from_env.encode("utf-8"), f"${SIGNING_KEY_ENV}")
        return Signer.load(Path(from_env))
    if default_key_paths().existing_private() is None:
        if not allow_create:
            raise KeyFileError(NO_KEY, str(default_key_paths().private))
        return lambda: _announced(ensure_default_key(allow_create=True), on_note)
    return _announced(ensure_default_key(allow_create=False), on_note)


def _announced(key: DefaultKey, on_note: Callable[[str], None]) -> Signer:
    for note in key.notes:
        on_note(note)
    return key.signer


def may_create_default_key() -> bool:
    """Whether `compile` and `sign` may create the default key: a person at a terminal."""
    return interactive()


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
