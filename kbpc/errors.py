"""The project's own error types. Every error a user can cause is a `KbpcError`: the CLI prints its
message (which names the file and the JSON path, node or edge at fault) and exits with the error's
code (EXIT_CODES; 2 for bad input)."""
from __future__ import annotations

import re

# Rendered errors stay readable whatever the input held: `where` (a file name, a JSON path) and
# each line of the message are cut, and control characters (terminal escapes, carriage returns)
# are shown as escapes instead of being written to the user's terminal.
MAX_WHERE_CHARS = 300
MAX_LINE_CHARS = 1000
MAX_LINES = 200
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def bounded(text: str, limit: int) -> str:
    """`text` with control characters escaped, cut to about `limit` characters."""
    text = str(text)
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit} more characters)"
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


def render(message: str, where: str | None, multiline: bool = False) -> str:
    """`where: message`, bounded; a newline in the message is shown as an escape unless
    `multiline` (a compiler log), so an error stays one line whatever the input held."""
    lines = str(message).split("\n") if multiline else [str(message).replace("\n", "\\n")]
    shown = [bounded(line, MAX_LINE_CHARS) for line in lines[:MAX_LINES]]
    if len(lines) > MAX_LINES:
        shown.append(f"... ({len(lines) - MAX_LINES} more lines)")
    text = "\n".join(shown)
    return f"{bounded(where, MAX_WHERE_CHARS)}: {text}" if where else text


class KbpcError(Exception):
    """A user-facing error: bad input, a failed check, a refused bundle. `where` locates it.
    Its text (`str(exc)`) is bounded: see `render`."""

    exit_code = 2
    multiline = False

    def __init__(self, message: str, where: str | None = None):
        self.message = message
        self.where = where
        super().__init__(render(message, where, self.multiline))


class KbpcWarning(UserWarning):
    """Something the user should know that does not stop the command (the CLI prints one line)."""


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
    multiline = True


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
