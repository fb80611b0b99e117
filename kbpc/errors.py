"""The project's own error types. Every error a user can cause is a `KbpcError`: the CLI prints its
message (which names the file and the JSON path, node or edge at fault) and exits with code 2."""
from __future__ import annotations


class KbpcError(Exception):
    """A user-facing error: bad input, a failed check, a refused bundle. `where` locates it."""

    exit_code = 2

    def __init__(self, message: str, where: str | None = None):
        self.message = message
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class BlueprintError(KbpcError):
    """The blueprint is malformed or inconsistent."""


class ConfigError(KbpcError):
    """A model-config file or override is invalid."""


class WeightsError(KbpcError):
    """A weight source (synthetic spec or checkpoint) is invalid or does not match the blueprint."""


class BuildError(KbpcError):
    """nvcc failed; the message carries the command, the source and the log."""


class BundleError(KbpcError):
    """A .kbp bundle is malformed, tampered with, or not trusted."""


class DeviceError(KbpcError):
    """No usable GPU, not enough GPU memory, or a CUDA failure."""
