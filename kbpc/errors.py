"""The project's own error types. Every error a user can cause is a `KbpcError`: the CLI prints its
message (which names the file and the JSON path, node or edge at fault) and exits with the error's
code (EXIT_CODES; 2 for bad input)."""
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


class VerificationError(KbpcError):
    """Something that must verify does not: a bundle, a checkpoint against the bundle that binds
    it, the GPU step against the reference."""

    exit_code = 3


class BuildError(KbpcError):
    """nvcc failed; the message carries the command, the source and the log."""

    exit_code = 5


class BundleError(VerificationError):
    """A .kbp bundle is malformed, tampered with, or not trusted."""


class DeviceError(KbpcError):
    """No usable GPU, not enough GPU memory, or a CUDA failure."""

    exit_code = 4


EXIT_INTERNAL = 70        # EX_SOFTWARE: a bug in kbpc
EXIT_CODES = {             # what `kbpc --help` and docs/exit-codes.md list
    0: "success",
    2: "bad input: a blueprint, config, checkpoint, key file or option is invalid",
    3: "verification failed: a bundle is malformed, tampered with or not trusted, a checkpoint does "
       "not match the bundle that binds it, or the GPU step does not match the reference",
    4: "device error: no usable GPU, the wrong GPU for the bundle, not enough memory, a CUDA failure",
    5: "build failed: nvcc or the linker failed, or the toolchain or build cache is unusable",
    EXIT_INTERNAL: "internal error: a bug in kbpc (one line; KBPC_TRACEBACK=1 shows the traceback)",
    130: "interrupted (Ctrl-C)",
    143: "terminated (SIGTERM)",
}
