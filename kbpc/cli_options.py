"""Pieces every kbpc command shares: the error convention and common options."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from kbpc.errors import KbpcError


def reports_errors(fn):
    """Turn KbpcError into a one-line message on stderr and its exit code (2), no traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
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
