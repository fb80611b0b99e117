"""`kbpc compile`'s build report (schema kbpc-compile/v1, docs/schemas/): what was built, from what,
with which toolchain, how long each stage took and which objects came from the cache. CI keeps it
beside the bundle it publishes."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from kbpc.bundle.manifest import canonical_json
from kbpc.compiler import CompileResult

SCHEMA = "kbpc-compile/v1"


def build_report(result: CompileResult, output: Path, signer_ids: list[str], stages: list[tuple[str, float]],
                 seconds: float) -> dict[str, Any]:
    m = result.manifest
    build = result.build
    return {
        "schema": SCHEMA,
        "output": str(output),
        "bytes": Path(output).stat().st_size,
        "manifest_sha256": hashlib.sha256(canonical_json(m)).hexdigest(),
        "kind": m["kind"],
        "blueprint_id": m["blueprint_id"],
        "plan_digest": m["plan_digest"],
        "target": m["target"],
        "options": m["options"],
        "toolchain": m["toolchain"],
        "signers": signer_ids,
        "members": len(m["members"]),
        "launches": m["step"]["launches"],
        "kernel_instances": m["step"]["kernel_instances"],
        "fusion": result.fusion.to_json(),
        "objects": {"total": len(build.units), "compiled": build.compiled, "cached": build.cached},
        "units": [{"name": u.name, "key": u.key, "cached": u.cached, "seconds": round(u.seconds, 3)}
                  for u in build.units],
        "stages": [{"name": name, "seconds": round(s, 3)} for name, s in stages],
        "seconds": round(seconds, 3),
    }


def summary_line(report: dict[str, Any]) -> str:
    return (f"wrote {report['output']}: {report['kind']} bundle, target {report['target']}, plan "
            f"{report['plan_digest'][:12]}, {report['launches']} launches, {report['kernel_instances']} kernel "
            f"instances ({report['objects']['compiled']} compiled, {report['objects']['cached']} cached) in "
            f"{report['seconds']:.1f} s")
