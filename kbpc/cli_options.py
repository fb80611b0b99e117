"""Pieces every kbpc command shares: the error convention and common options."""
from __future__ import annotations

import functools
import signal
import sys
import threading
from pathlib import Path

import click

from kbpc.errors import KbpcError


def _terminated(signum, _frame):
    # SIGTERM (a CI job cancelled, `kill`) unwinds like Ctrl-C: nvcc jobs are ended, build folders
    # and half-written outputs removed, by the same `finally` blocks.
    raise SystemExit(128 + signum)


def reports_errors(fn):
    """Turn KbpcError into a one-line message on stderr and its exit code (2), no traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
        try:
            return fn(*args, **kwargs)
        except KbpcError as exc:
            click.echo(f"kbpc: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, previous)
    return wrapper


CONFIG_OPTION = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Model config JSON overriding symbols and constants the blueprint does not carry "
         '(e.g. {"symbols": {"q_heads": 32}, "constants": {"swiglu_limit": 7.0}}).')

TRUST_OPTION = click.option(
    "--trust", "trust_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Keyring of trusted signers (default: the local default key's keyring).")
