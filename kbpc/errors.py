"""The project's own error types. Every error a user can cause is a `KbpcError`: the CLI prints its
message (which names the file and the JSON path, node or edge at fault) and exits with code 2."""
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


class BuildError(KbpcError):
    """nvcc failed; the message carries the command, the source and the log."""

    multiline = True


class BundleError(KbpcError):
    """A .kbp bundle is malformed, tampered with, or not trusted."""


class DeviceError(KbpcError):
    """No usable GPU, not enough GPU memory, or a CUDA failure."""
