"""GPU targets: one frozen record per target, naming its nvcc code generation and which
instructions exist there. Passes ask the table, never a compute capability number."""
from __future__ import annotations

from dataclasses import dataclass

from kbpc.errors import KbpcError


@dataclass(frozen=True)
class Target:
    name: str                 # the --target value
    gpus: str                 # what it is, for people
    gencode: tuple[str, ...]  # nvcc code-generation flags
    fp8_mma: bool             # mma.sync ... e4m3 (sm_89+)
    fp4_block_mma: bool       # mma.sync ... kind::mxf4nvf4.block_scale (sm_120a/121a/121f)

    @property
    def arch_macro(self) -> str:
        return self.name.removeprefix("sm_").rstrip("afF")


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm_90", "H100 / H200 (Hopper)",
               ("-gencode=arch=compute_90a,code=sm_90a",), fp8_mma=True, fp4_block_mma=False),
        Target("sm_100", "B200 / GB200 (Blackwell datacenter)",
               ("-gencode=arch=compute_100a,code=sm_100a",), fp8_mma=True, fp4_block_mma=False),
        Target("sm_120", "RTX Blackwell (consumer)",
               ("-gencode=arch=compute_120a,code=sm_120a",), fp8_mma=True, fp4_block_mma=True),
        Target("sm_121", "GB10 (DGX Spark)",
               ("-gencode=arch=compute_121a,code=sm_121a",), fp8_mma=True, fp4_block_mma=True),
    )
}

DEFAULT_TARGET = "sm_90"


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        known = ", ".join(sorted(TARGETS))
        raise KbpcError(f"unknown target {name!r}; known targets: {known}", "--target") from None
