"""The one module that reads the process environment: environment variables, and whether a person
is at a terminal. Everything else asks here.

  KBPC_SIGNING_KEY             the signing key for `compile` / `sign` when --key is not given: a
                               private key file's path, or the key file's PEM text itself (what a
                               CI secret usually holds)
  KBPC_SIGNING_KEY_PASSPHRASE  the passphrase of an encrypted private key (PEM), and the one
                               `kbpc keygen --encrypt` encrypts a new key with
  CI                           set (to anything but "", "0" or "false") by CI services: kbpc then
                               never creates a signing key on its own
  KBPC_TEST_CUBIN_CACHE        where the GPU test harness caches compiled test kernels
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

SIGNING_KEY_ENV = "KBPC_SIGNING_KEY"
PASSPHRASE_ENV = "KBPC_SIGNING_KEY_PASSPHRASE"


def signing_key_from_env() -> str | None:
    value = os.environ.get(SIGNING_KEY_ENV, "")
    return value if value.strip() else None


def key_passphrase() -> bytes | None:
    value = os.environ.get(PASSPHRASE_ENV)
    return value.encode("utf-8") if value else None


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def interactive() -> bool:
    """A person at a terminal (stdin is a TTY) and not a CI job."""
    try:
        return sys.stdin is not None and sys.stdin.isatty() and not in_ci()
    except (ValueError, OSError):   # a closed or detached stdin
        return False


def gpu_test_cubin_cache() -> Path:
    return Path(os.environ.get("KBPC_TEST_CUBIN_CACHE", tempfile.gettempdir())) / "kbpc-test-cubins"
