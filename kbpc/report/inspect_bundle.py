"""`kbpc inspect BUNDLE.kbp`: what a verified bundle holds (manifest fields, signers, members)."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from kbpc.bundle.container import Bundle
from kbpc.report.parallel import render_tp
from kbpc.report.render import kv_table, human_bytes

_MEMBER_ROWS = 60  # longer member lists are cut, with the directory totals still complete


def summarize_bundle(bundle: Bundle) -> dict[str, Any]:
    """Manifest fields the compiler records (None where a bundle lacks one), the signers, and the
    members with their sizes, totals per top-level directory and overall."""
    m = bundle.manifest
    members = [{"path": r["path"], "size": r["size"], "sha256": r["sha256"]} for r in m["members"]]
    by_dir: dict[str, dict[str, int]] = defaultdict(lambda: {"files": 0, "bytes": 0})
    for r in members:
        top = r["path"].split("/")[0] if "/" in r["path"] else "."
        by_dir[top]["files"] += 1
        by_dir[top]["bytes"] += r["size"]
    return {
        "path": str(bundle.path),
        "schema": m["schema"],
        "kind": m.get("kind"),
        "blueprint_id": m.get("blueprint_id"),
        "lineage": m.get("lineage"),
        "revision": m.get("revision"),
        "plan_digest": m.get("plan_digest"),
        "target": m.get("target"),
        "numerics": (m.get("options") or {}).get("numerics"),
        "tp_size": m.get("tp_size"),
        "tp": m.get("tp"),
        "toolchain": m.get("toolchain"),
        "step": m.get("step"),
        "signers": list(bundle.signers),
        "members": members,
        "member_count": len(members),
        "total_member_bytes": sum(r["size"] for r in members),
        "file_bytes": bundle.size,
        "by_directory": dict(sorted(by_dir.items())),
    }


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_text(v)}" for k, v in value.items())
    if isinstance(value, list):
        return " ".join(_text(v) for v in value)
    return str(value)


def render_bundle_summary(s: dict[str, Any], console: Console) -> None:
    overview = [
        ("bundle", s["path"]), ("schema", s["schema"]), ("kind", _text(s["kind"])),
        ("blueprint", _text(s["blueprint_id"])),
        ("lineage / revision", f"{_text(s['lineage'])} / {_text(s['revision'])}"),
        ("plan digest", _text(s["plan_digest"])), ("target", _text(s["target"])),
        ("numerics", _text(s["numerics"])),
        ("tensor parallel", _text(s["tp_size"])), ("step", _text(s["step"])),
        ("toolchain", _text(s["toolchain"])),
        ("signed by", ", ".join(s["signers"])),
        ("members", f"{s['member_count']:,} files, {human_bytes(s['total_member_bytes'])} "
                    f"(file {human_bytes(s['file_bytes'])})"),
    ]
    console.print(kv_table("Bundle", overview))
    if s.get("tp"):
        render_tp(s["tp"], console)
    dirs = Table(title="Members by directory", title_justify="left")
    for col in ("directory", "files", "bytes"):
        dirs.add_column(col, justify="left" if col == "directory" else "right")
    for name, row in s["by_directory"].items():
        dirs.add_row(name, f"{row['files']:,}", human_bytes(row["bytes"]))
    console.print(dirs)
    table = Table(title="Members", title_justify="left")
    table.add_column("path")
    table.add_column("bytes", justify="right")
    table.add_column("sha256")
    for r in s["members"][:_MEMBER_ROWS]:
        table.add_row(r["path"], f"{r['size']:,}", r["sha256"][:16] + "…")
    if len(s["members"]) > _MEMBER_ROWS:
        table.add_row(f"… {len(s['members']) - _MEMBER_ROWS} more", "", "")
    console.print(table)
