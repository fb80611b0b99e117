"""Pieces every kbpc command shares: the error convention (one line, a distinct exit code, no
traceback), the JSON report convention and common options."""
from __future__ import annotations

import functools
import json
import math
import signal
import sys
import threading
import traceback
import warnings
from pathlib import Path
from typing import Any

import click

from kbpc.errors import EXIT_CODES, EXIT_INTERNAL, MAX_LINE_CHARS, KbpcError, KbpcWarning, bounded

EXIT_CODES_HELP = "\b\nExit codes:\n" + "\n".join(f"  {code:<4} {text}" for code, text in EXIT_CODES.items())


def _terminated(signum, _frame):
    # SIGTERM (a CI job cancelled, `kill`) unwinds like Ctrl-C: nvcc jobs are ended, build folders
    # and half-written outputs removed, by the same `finally` blocks.
    raise SystemExit(128 + signum)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if issubclass(category, KbpcWarning):
        click.echo(f"kbpc: warning: {bounded(str(message), MAX_LINE_CHARS)}", err=True)
    else:
        _PYTHON_SHOWWARNING(message, category, filename, lineno, file, line)


_PYTHON_SHOWWARNING = warnings.showwarning


def _fail(message: str, code: int, as_json: bool) -> None:
    click.echo(f"kbpc: {message}", err=True)
    if as_json:   # stdout still holds one JSON document
        click.echo(json.dumps({"schema": "kbpc-error/v1", "error": message, "exit_code": code}, indent=2))
    sys.exit(code)


def reports_errors(fn):
    """Every failure becomes one line on stderr and its exit code (EXIT_CODES); with --json, a
    `kbpc-error/v1` object on stdout too. A bug prints one line and how to see its traceback.
    A KbpcWarning prints as one `kbpc: warning:` line."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        warnings.showwarning = _show_warning
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
        as_json = bool(kwargs.get("as_json"))
        try:
            return fn(*args, **kwargs)
        except KbpcError as exc:
            _fail(f"error: {exc}", exc.exit_code, as_json)
        except KeyboardInterrupt:
            _fail("interrupted", 130, as_json)
        except (click.exceptions.ClickException, click.exceptions.Abort, click.exceptions.Exit):
            raise
        except Exception as exc:  # anything else is a bug in kbpc, not the user's doing
            from kbpc.settings import environment
            if environment().traceback:
                traceback.print_exc()
            first = str(exc).splitlines()[0][:300] if str(exc) else ""
            _fail(f"internal error: {type(exc).__name__}: {first} (a bug in kbpc; set KBPC_TRACEBACK=1 "
                  "for the traceback)", EXIT_INTERNAL, as_json)
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, previous)
    return wrapper


def json_options(fn):
    """--json (the report on stdout, instead of text) and --json-out FILE (also written to FILE)."""
    fn = click.option("--json-out", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
                      help="Also write the JSON report to this file (atomically).")(fn)
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the report as one JSON object on stdout instead of text.")(fn)


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: a measurement that produced one is reported as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def emit_report(report: dict[str, Any], as_json: bool, json_out: Path | None) -> bool:
    """Write `report` where --json/--json-out ask; True when the text output is to be skipped."""
    text = json.dumps(_finite(report), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    if json_out is not None:
        from kbpc.util.atomic import write_text_atomic
        try:
            write_text_atomic(json_out, text)
        except OSError as exc:
            raise KbpcError(f"cannot write the report: {exc.strerror or exc}", str(json_out)) from None
    if as_json:
        click.echo(text, nl=False)
    return as_json


CONFIG_OPTION = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Model config JSON overriding symbols and constants the blueprint does not carry "
         '(e.g. {"symbols": {"q_heads": 32}, "constants": {"swiglu_limit": 7.0}}).')

TRUST_OPTION = click.option(
    "--trust", "trust_paths", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
    help="Keyring file of trusted public keys (repeatable; they add up). Default: the keyring of "
         "your default key, in the kbpc config directory.")
