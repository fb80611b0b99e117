"""Human-readable rendering of report dicts with rich."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kbpc.errors import bounded


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return f"{n} TB"


def cell(value: Any) -> Text:
    """A table cell showing `value` as plain text: report values come from blueprints and bundles,
    and rich would read `[...]` in them as markup (and fail on a stray `[/]`) and pass terminal
    escapes through; control characters are shown escaped and long values cut."""
    return Text(bounded(str(value), 1000))


def kv_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(cell(key), cell(value))
    return table


def render_blueprint_summary(s: dict[str, Any], console: Console) -> None:
    overview = [
        ("schema", s["blueprint_schema"]), ("blueprint", s["blueprint_id"]), ("source", s["source"]),
        ("arm", f"{s['arm'].get('mode')} rows={s['arm'].get('rows')}"),
        ("layers", f"{s['layers']}  (" + ", ".join(f"{k}: {v}" for k, v in s["layers_by_template"].items()) + ")"),
        ("nodes / edges", f"{s['nodes']:,} / {s['edges']:,}"),
        ("groups", f"{s['groups']:,} ({s['device_groups']:,} on the device)"),
        ("kernel launches / step", f"{s['launches']:,}"),
        ("weights", f"{human_bytes(s['weight_bytes'])} in {s['weight_tensors']:,} tensors"),
        ("read per decode token", human_bytes(s["bytes_per_token"])),
        ("bandwidth floor", f"{s['roofline_step_ms']:.3f} ms/token = {s['roofline_tokens_per_s']:.1f} tok/s "
                            f"at {s['bandwidth_gbs']:,.0f} GB/s"),
    ]
    if "context" in s:
        overview.append((f"at context {s['context']:,}", f"{human_bytes(s['step_bytes_at_context'])}/token with "
                         f"activations, state and caches = {s['roofline_tokens_per_s_at_context']:.1f} tok/s"))
    console.print(kv_table("Blueprint", overview))
    fmt = Table(title="Weight bytes by format", title_justify="left")
    fmt.add_column("format")
    fmt.add_column("bytes", justify="right")
    for name, value in s["weight_bytes_by_format"].items():
        fmt.add_row(cell(name), human_bytes(value))
    console.print(fmt)
    fam = Table(title="Kernel families", title_justify="left")
    for col in ("family", "groups", "launches", "nodes"):
        fam.add_column(col, justify="left" if col == "family" else "right")
    for name, row in s["families"].items():
        fam.add_row(cell(name), str(row["groups"]), str(row["launches"]), str(row["nodes"]))
    console.print(fam)
    ops = Table(title="Nodes by op", title_justify="left")
    ops.add_column("op")
    ops.add_column("nodes", justify="right")
    for name, count in s["nodes_by_op"].items():
        ops.add_row(cell(name), str(count))
    console.print(ops)
    console.print(kv_table("Symbols", [(k, f"{v:,}") for k, v in s["symbols"].items()]))


def console(stderr: bool = False) -> Console:
    """A Console for reports: sized by the terminal in one; without a terminal (CI logs, pipes)
    wide enough that no table is cut at 80 columns (tables only take the width they need)."""
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=1000)
