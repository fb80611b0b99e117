"""Write docs/cli.md from the commands' own --help texts, so the reference cannot drift from the
code (tests/unit/test_docs.py checks the file is current).

    python3 scripts/gen_cli_docs.py
"""
from __future__ import annotations

from pathlib import Path

import click

from kbpc.cli import main

OUT = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
HEAD = """# CLI reference

Generated from `kbpc --help` and each command's `--help` by `scripts/gen_cli_docs.py`; do not edit.
Conventions every command shares: errors are one line on stderr and a distinct exit code
([exit-codes.md](exit-codes.md)); reports are also JSON with `--json` (stdout) or `--json-out FILE`
([json-reports.md](json-reports.md)); `--trust KEYRING` may be repeated and the keyrings add up.
"""


def _walk(command: click.Command, path: list[str], parent: click.Context | None):
    # the group's context settings (help option names) as `kbpc` itself uses them
    ctx = click.Context(command, info_name=path[-1], parent=parent, terminal_width=100, max_content_width=100,
                        **main.context_settings)
    yield path, command.get_help(ctx)
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            yield from _walk(command.commands[name], [*path, name], ctx)


def render() -> str:
    parts = [HEAD]
    for path, text in _walk(main, ["kbpc"], None):
        parts.append(f"## `{' '.join(path)}`\n\n```text\n{text.rstrip()}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["--stdout"]:   # in a fresh process: click caches help options per command
        sys.stdout.write(render())
    else:
        OUT.write_text(render())
        print(f"wrote {OUT}")
