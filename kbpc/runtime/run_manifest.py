"""What the runner needs from a verified bundle's manifest, as one typed record: the library per
rank, the weights and state it allocates, the target, the options that bound it (max context,
numerics mode) and the checkpoint it binds. The runner reads these and recomputes none of them; a
manifest that lacks one or holds a malformed one is refused (a bundle from a newer or broken
kbpc), not half-used."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kbpc.errors import BundleError
from kbpc.weights.binding import CheckpointFile


@dataclass(frozen=True)
class TensorRecord:
    name: str
    storage: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class ProfileMark:
    """A mark of the serialized profile (kbp_profile_step): the launch it follows, as the compiler
    recorded it in the manifest's step.marks (kbpc.codegen.records.profile_marks)."""
    group: int
    family: str
    stream: int
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class RunManifest:
    kind: str                          # "lite" or "full" (weights embedded under weights/)
    blueprint_id: str
    plan_digest: str
    target: str
    max_context: int
    numerics: str
    index_cache: str                   # the DSA indexer's pool-key cache (f32 | fp8)
    libraries: dict[str, str]          # rank -> member path of its shared library
    weights: tuple[TensorRecord, ...]  # in the order the library's weight table has them
    state: tuple[TensorRecord, ...]
    checkpoint: tuple[CheckpointFile, ...] | None   # the checkpoint files the bundle binds
    launches: int
    groups: int
    act_quant: bool = True             # False: built without activation quantization (a debugging aid)
    marks: tuple[ProfileMark, ...] | None = None   # one per launch; None: a bundle whose profile marks groups
    stamps: tuple[str, ...] | None = None   # a profiling build's kernel instances, in kbp_stamp_logs order

    @classmethod
    def from_json(cls, m: dict[str, Any]) -> "RunManifest":
        try:
            options, step = m["options"], m["step"]
            return cls(
                kind=_one_of(m["kind"], ("lite", "full"), "kind"),
                blueprint_id=_typed(m["blueprint_id"], str, "blueprint_id"),
                plan_digest=_typed(m["plan_digest"], str, "plan_digest"),
                target=_typed(m["target"], str, "target"),
                max_context=_count(options["max_context"], "options.max_context"),
                numerics=_typed(options.get("numerics", "exact"), str, "options.numerics"),
                index_cache=_one_of(options.get("index_cache", "f32"), ("f32", "fp8"), "options.index_cache"),
                act_quant=_flag(options.get("act_quant", True), "options.act_quant"),
                libraries={_typed(k, str, "library"): _typed(v, str, f"library.{k}") for k, v in m["library"].items()},
                weights=tuple(_tensor(w, f"weights[{i}]") for i, w in enumerate(m["weights"])),
                state=tuple(_tensor({**s, "storage": s.get("storage", "")}, f"state[{i}]")
                            for i, s in enumerate(m["state"])),
                checkpoint=None if m.get("checkpoint") is None else tuple(
                    CheckpointFile(_typed(c["name"], str, "checkpoint.name"), _count(c["bytes"], "checkpoint.bytes"),
                                   _typed(c["sha256"], str, "checkpoint.sha256")) for c in m["checkpoint"]),
                launches=_count(step["launches"], "step.launches"),
                groups=_count(step["groups"], "step.groups"),
                marks=None if step.get("marks") is None else tuple(
                    _mark(d, f"step.marks[{i}]") for i, d in enumerate(_typed(step["marks"], list, "step.marks"))),
                stamps=None if step.get("stamps") is None else tuple(
                    _typed(n, str, f"step.stamps[{i}]") for i, n in enumerate(_typed(step["stamps"], list, "step.stamps"))),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise BundleError(f"manifest.json lacks a field the runner needs or holds it in another form "
                              f"({type(exc).__name__}: {exc})") from None

    def library(self, rank: int = 0) -> str:
        try:
            return self.libraries[f"rank{rank}"]
        except KeyError:
            raise BundleError(f"the bundle has no library for rank {rank}") from None


def _typed(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BundleError(f"manifest.json: {where} must be a {kind.__name__}")
    return value


def _count(value: Any, where: str) -> int:
    if _typed(value, int, where) < 0:
        raise BundleError(f"manifest.json: {where} must not be negative")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise BundleError(f"manifest.json: {where} must be true or false")
    return value


def _one_of(value: Any, allowed: tuple[str, ...], where: str) -> str:
    if value not in allowed:
        raise BundleError(f"manifest.json: {where} must be one of {', '.join(allowed)}")
    return value


def _tensor(doc: dict, where: str) -> TensorRecord:
    shape = tuple(_count(d, f"{where}.shape") for d in doc["shape"])
    return TensorRecord(_typed(doc["name"], str, f"{where}.name"), _typed(doc["storage"], str, f"{where}.storage"),
                        shape, _count(doc["bytes"], f"{where}.bytes"))


def _mark(doc: dict, where: str) -> ProfileMark:
    nodes = tuple(_typed(n, str, f"{where}.nodes") for n in _typed(doc["nodes"], list, f"{where}.nodes"))
    return ProfileMark(_count(doc["group"], f"{where}.group"), _typed(doc["family"], str, f"{where}.family"),
                       _count(doc["stream"], f"{where}.stream"), nodes)
