"""`kbpc inspect BUNDLE.kbp`: what a bundle holds (manifest fields, signers, members). A bundle by
an untrusted signer is shown too (its container and members checked, its signatures not), under a
warning that says so; nothing in a bundle is ever loaded to inspect it."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kbpc.bundle.container import Bundle, UntrustedError, open_bundle, open_untrusted
from kbpc.bundle.keyfile import KeyFileError
from kbpc.bundle.keystore import trusted_keyring
from kbpc.report.render import cell, human_bytes, kv_table
from kbpc.report.parallel import render_tp

_MEMBER_ROWS = 60  # longer member lists are cut, with the directory totals still complete


SCHEMA = "kbpc-inspect-bundle/v1"


def summarize_bundle(bundle: Bundle, untrusted_reason: str | None = None) -> dict[str, Any]:
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
        "schema": SCHEMA,
        "path": str(bundle.path),
        "trusted": bundle.trusted,
        "untrusted_reason": None if bundle.trusted else untrusted_reason,
        "bundle_schema": m["schema"],
        "kind": m.get("kind"),
        "blueprint_id": m.get("blueprint_id"),
        "lineage": m.get("lineage"),
        "revision": m.get("revision"),
        "plan_digest": m.get("plan_digest"),
        "target": m.get("target"),
        "numerics": (m.get("options") or {}).get("numerics"),
        "act_quant": (m.get("options") or {}).get("act_quant", True),
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


_FUSION_KINDS = 40  # refusal kinds listed; the rest are counted


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def step_line(step: Any) -> str:
    """One line for the manifest's step record: launches, groups, streams, events, kernel instances,
    the arena and the modelled critical path. Fields of an unexpected type are left out, anything
    that is not a record is shown as it is (an untrusted bundle's manifest can hold anything);
    the fusion report has its own tables (fusion_tables)."""
    if not isinstance(step, dict):
        return _text(step)
    parts = []
    launches, groups, streams = _int(step.get("launches")), _int(step.get("groups")), _int(step.get("streams"))
    if launches is not None:
        where = "".join((f" in {groups:,} groups" if groups is not None else "",
                         f" on {streams} streams" if streams is not None else ""))
        extra = [f"{n:,} {what}" for n, what in ((_int(step.get("events")), "events"),
                                                 (_int(step.get("priority_launches")), "at high priority"))
                 if n is not None]
        parts.append(f"{launches:,} launches{where}" + (f" ({', '.join(extra)})" if extra else ""))
    if _int(step.get("kernel_instances")) is not None:
        parts.append(f"{step['kernel_instances']:,} kernel instances")
    if _int(step.get("vocab")) is not None:
        parts.append(f"vocabulary {step['vocab']:,}")
    if _int(step.get("arena_bytes")) is not None:
        parts.append(f"arena {human_bytes(step['arena_bytes'])}")
    critical, serial = _num(step.get("critical_path_us")), _num(step.get("serial_us"))
    if critical is not None:
        parts.append(f"modelled critical path {critical:,.1f} us" + (f" (serial {serial:,.1f} us)" if serial is not None
                                                                     else ""))
    marks = step.get("marks")
    if isinstance(marks, list):
        parts.append(f"{len(marks):,} profile marks")
    known = {"launches", "groups", "streams", "events", "priority_launches", "kernel_instances", "arena_bytes",
             "critical_path_us", "serial_us", "fusion", "vocab", "marks"}
    rest = {k: v for k, v in step.items() if k not in known}
    if rest:
        parts.append(_text(rest))
    return "; ".join(parts) if parts else "-"


def _fusion_parts(fusion: Any) -> tuple[dict, list] | None:
    """(applied, left_apart) of a fusion record of the compiler's shape, else None."""
    if not isinstance(fusion, dict):
        return None
    applied, left = fusion.get("applied"), fusion.get("left_apart")
    return (applied, left) if isinstance(applied, dict) and isinstance(left, list) else None


def fusion_line(fusion: Any) -> str | None:
    """The fusion report in one line (None without one of the compiler's shape)."""
    parts = _fusion_parts(fusion)
    if parts is None:
        return None
    applied, left = parts
    before, after = _int(fusion.get("launches_before")), _int(fusion.get("launches_after"))
    merges = sum(n for n in applied.values() if _int(n) is not None)
    head = f"{before:,} -> {after:,} launches per step; " if before is not None and after is not None else ""
    return f"{head}{len(applied)} rules applied ({merges:,} merges), {len(left):,} candidates left apart"


def fusion_tables(fusion: Any) -> list[Table]:
    """The fusion report of the manifest's step record as tables: the rules applied (how often) and
    the candidates left apart, one row per rule and reason. Empty when the record does not have the
    compiler's shape (then the step row shows nothing of it)."""
    parts = _fusion_parts(fusion)
    if parts is None:
        return []
    applied, left = parts
    done = Table(title="Fusion rules applied", title_justify="left")
    done.add_column("rule")
    done.add_column("merges", justify="right")
    for rule, n in sorted(applied.items(), key=lambda kv: str(kv[0])):
        done.add_row(cell(rule), cell(n))
    kinds: dict[tuple[str, str], int] = defaultdict(int)
    for record in left:
        if isinstance(record, dict):
            kinds[(str(record.get("rule", "?")), str(record.get("reason", "?")))] += 1
    apart = Table(title="Fusion candidates left apart", title_justify="left")
    apart.add_column("rule")
    apart.add_column("times", justify="right")
    apart.add_column("why")
    ordered = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))
    for (rule, reason), n in ordered[:_FUSION_KINDS]:
        apart.add_row(cell(rule), f"{n:,}", cell(reason))
    if len(ordered) > _FUSION_KINDS:
        apart.add_row(f"… {len(ordered) - _FUSION_KINDS} more kinds", "", "")
    return [done, apart] if ordered else [done]


def _step_fusion(step: Any) -> Any:
    return step.get("fusion") if isinstance(step, dict) else None


UNTRUSTED_WARNING = ("UNTRUSTED: the signer is not in your trusted keyring, so the signatures were not "
                     "checked and this bundle may come from anyone; its members match its manifest. "
                     "Nothing in it was loaded. Trust its signer (--trust KEYRING) only if you know them.")


def render_bundle_summary(s: dict[str, Any], console: Console) -> None:
    if not s["trusted"]:
        # the reason quotes the bundle (untrusted bytes): plain text, never markup
        console.print(Text(UNTRUSTED_WARNING, style="bold red"), Text(f"\n  ({s['untrusted_reason']})"),
                      sep="", highlight=False)
    overview = [
        ("bundle", s["path"]), ("schema", s["bundle_schema"]), ("kind", _text(s["kind"])),
        ("blueprint", _text(s["blueprint_id"])),
        ("lineage / revision", f"{_text(s['lineage'])} / {_text(s['revision'])}"),
        ("plan digest", _text(s["plan_digest"])), ("target", _text(s["target"])),
        ("numerics", _text(s["numerics"]) + ("" if s["act_quant"] is not False else
                                              ", activations unquantized (--no-act-quant: a debugging build)")),
        ("tensor parallel", _text(s["tp_size"])), ("step", step_line(s["step"])),
        *([("fusion", line)] if (line := fusion_line(_step_fusion(s["step"]))) else []),
        *([("phase stamps", f"on: a profiling build (kbpc compile --stamps), {len(stamps)} kernel instances log them "
                            "(bench/replay_stamps.py)")]
          if isinstance(s["step"], dict) and isinstance(stamps := s["step"].get("stamps"), list) else []),
        ("toolchain", _text(s["toolchain"])),
        ("signed by", ", ".join(s["signers"]) + ("" if s["trusted"] else "  (UNTRUSTED, not verified)")),
        ("members", f"{s['member_count']:,} files, {human_bytes(s['total_member_bytes'])} "
                    f"(file {human_bytes(s['file_bytes'])})"),
    ]
    console.print(kv_table("Bundle", overview))
    for table in fusion_tables(_step_fusion(s["step"])):
        console.print(table)
    if s.get("tp"):
        render_tp(s["tp"], console)
    dirs = Table(title="Members by directory", title_justify="left")
    for col in ("directory", "files", "bytes"):
        dirs.add_column(col, justify="left" if col == "directory" else "right")
    for name, row in s["by_directory"].items():
        dirs.add_row(cell(name), f"{row['files']:,}", human_bytes(row["bytes"]))
    console.print(dirs)
    table = Table(title="Members", title_justify="left")
    table.add_column("path")
    table.add_column("bytes", justify="right")
    table.add_column("sha256")
    for r in s["members"][:_MEMBER_ROWS]:
        table.add_row(cell(r["path"]), f"{r['size']:,}", r["sha256"][:16] + "…")
    if len(s["members"]) > _MEMBER_ROWS:
        table.add_row(f"… {len(s['members']) - _MEMBER_ROWS} more", "", "")
    console.print(table)


def inspect_bundle(path: Path, trust_paths: Sequence[Path]) -> dict[str, Any]:
    """The summary of the bundle at `path`: verified against the keyrings at `trust_paths` (default:
    the default key's), or, when its signer is not trusted, opened without its signatures."""
    try:
        trust = trusted_keyring(trust_paths)
    except KeyFileError as exc:
        if trust_paths:        # a keyring the user named is unusable: that is their error
            raise
        trust, reason = None, exc.message
    if trust is not None:
        try:
            with open_bundle(path, trust) as bundle:
                return summarize_bundle(bundle)
        except UntrustedError as exc:
            reason = exc.message
    with open_untrusted(path) as bundle:
        return summarize_bundle(bundle, reason)
