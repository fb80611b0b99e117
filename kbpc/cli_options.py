"""Pieces every kbpc command shares: the error convention and common options."""
from __future__ import annotations

import functools
import sys
import warnings
from pathlib import Path

import click

from kbpc.errors import MAX_LINE_CHARS, KbpcError, KbpcWarning, bounded


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if issubclass(category, KbpcWarning):
        click.echo(f"kbpc: warning: {bounded(str(message), MAX_LINE_CHARS)}", err=True)
    else:
        _PYTHON_SHOWWARNING(message, category, filename, lineno, file, line)


_PYTHON_SHOWWARNING = warnings.showwarning


def reports_errors(fn):
    """Turn KbpcError into a one-line message on stderr and its exit code (2), no traceback;
    print KbpcWarning as one `kbpc: warning:` line."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        warnings.showwarning = _show_warning
        try:
            return fn(*args, **kwargs)
        except KbpcError as exc:
            click.echo(f"kbpc: error: {exc}", err=True)
            sys.exit(exc.exit_code)
    return wrapper


CONFIG_OPTION = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Model config JSON overriding symbols and constants the blueprint does not carry "
         '(e.g. {"symbols": {"q_heads": 32}, "constants": {"swiglu_limit": 7.0}}).')

TRUST_OPTION = click.option(
    "--trust", "trust_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Keyring of trusted signers (default: the local default key's keyring).")
