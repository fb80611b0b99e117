"""Type-check one family's lowering without the rest: lower only that family's groups of a
blueprint, render their kernel TUs and a TU that calls every launcher with the generated
arguments, and compile both with nvcc (no GPU needed).

    python3 -m kbpc.codegen.selfcheck FAMILY [BLUEPRINT] [--target sm_90]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from kbpc.toolchain.nvcc import compile_cuda
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.emit import _env
from kbpc.codegen.families import lower_group
from kbpc.codegen.render_args import launch_call, launcher_decl
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.targets import get_target

CALLER = """#include <cuda_runtime.h>
#include <stdint.h>
{includes}
{decls}
cudaError_t kbp_selfcheck(uint8_t* A, const void* const* W, void* const* S, const float* WS,
                          const int* TOKEN, const int* POS, const int* SEQ, cudaStream_t stream) {{
    cudaError_t e = cudaSuccess;
{calls}
    return e;
}}
"""


def selfcheck(family: str, blueprint: Path, target: str = "sm_90", out_dir: Path | None = None) -> list[Path]:
    plan = run_pipeline(load_blueprint(blueprint), Options(target=target))
    ctx = LowerCtx(plan)
    launches = [l for g in plan.groups if g.family == family for l in lower_group(ctx, g)]
    if not launches:
        raise SystemExit(f"no groups of family {family} in {blueprint}")
    out = Path(out_dir or tempfile.mkdtemp(prefix=f"kbpc-selfcheck-{family}-"))
    env = _env()
    instances = {l.instance.name: l.instance for l in launches}
    paths = []
    for name, inst in sorted(instances.items()):
        tu = out / f"{name}.cu"
        tu.write_text(env.get_template("kernel_instance.cu.j2").render(inst=inst))
        paths.append(tu)
    decls = "\n".join(launcher_decl(i) for i in instances.values())
    calls = "\n".join(f"    e = {launch_call(l, 'stream')};" for l in launches)
    includes = "\n".join(f'#include "{h}"' for h in sorted({i.header for i in instances.values()}))
    caller = out / "caller.cu"
    caller.write_text(CALLER.format(includes=includes, decls=decls, calls=calls))
    paths.append(caller)
    for src in paths:
        compile_cuda(src, src.with_suffix(".o"), get_target(target), kind="obj")
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("family")
    ap.add_argument("blueprint", nargs="?", type=Path,
                    default=Path(__file__).resolve().parents[2] / "examples" / "tiny.graph.json")
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    paths = selfcheck(args.family, args.blueprint, args.target, args.out)
    print(f"ok: {len(paths)} TUs compiled for {args.target} in {paths[0].parent}")


if __name__ == "__main__":
    main()
