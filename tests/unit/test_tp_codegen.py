"""A rank's step program: every partial sublayer output written into the rank's own slot of the
collective region, one all-gather per post-mix placed right before the launch that sums the
slots (RankParts<R> over every rank's slot, in rank order), no PDL edge out of a collective, the
expert-parallel id rewrite right after its router, and an unsplit step without any of it."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import CommPtr, walk
from kbpc.codegen.emit import build_step, generate
from kbpc.codegen.records import Collective, Launch
from kbpc.codegen.render_args import launch_call, render_arg
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.passes.split_tensor_parallel import rank_plan


@pytest.fixture(scope="module")
def ranks(tiny_path):
    plan = run_pipeline(load_blueprint(tiny_path), Options(tp=2))
    return plan, [build_step(rank_plan(plan, r), "x") for r in range(2)]


def _items(step):
    return [(g, l) for g in step.groups for l in g.launches]


def test_render_comm_pointer_and_collective():
    assert render_arg(CommPtr(512, "const __nv_bfloat16").plus(4)) == "((const __nv_bfloat16*)(COMM + 520))"
    c = Collective("all_gather", 1024, 512, 2, 3, ("l0.kda.post",), "l0.kda.o.o")
    assert launch_call(c, "streams[1]") == "kbp_tp_all_gather(COMM + 1024, 512ull, streams[1])"


def test_one_gather_per_post_mix_before_its_reader(ranks):
    plan, steps = ranks
    sites = plan.parallel.shards[0].partials
    for r, step in enumerate(steps):
        layout = step.collective_layout
        assert step.tp_rank == r and step.tp_ranks == 2 and step.comm_bytes == layout.comm_bytes
        items = _items(step)
        gathers = [l for _, l in items if isinstance(l, Collective)]
        assert [c.buffer for c in gathers] == list(sites)
        for site in layout.sites:
            own = site.offset + r * site.slot_bytes
            writers = [i for i, (_, l) in enumerate(items) if isinstance(l, Launch) and any(
                isinstance(a, CommPtr) and a.offset == own and not a.ctype.startswith("const")
                for arg in l.args for a in walk(arg))]
            gather = next(i for i, (_, l) in enumerate(items) if isinstance(l, Collective) and l.buffer == site.buffer)
            reader = items[gather + 1][1]
            slots = sorted(a.offset for arg in reader.args for a in walk(arg) if isinstance(a, CommPtr))
            assert len(writers) == 1 and writers[0] < gather
            assert slots == [site.offset + q * site.slot_bytes for q in range(2)]
            kernel = reader.instance.kernel
            # a post-mix summing 2 rank partials: standalone, fused into the next boundary (R is the
            # 4th template argument, then K = 0: no fused combine under tensor parallelism) or into
            # the head's norm (the last one)
            assert (kernel.startswith("kbp::mhc::hc_post<4, 256, 2,") or kernel.endswith(", 2, 0, 4>")
                    or (kernel.startswith("kbp::mhc::hc_head_norm<") and kernel.endswith(", 2, 0>")))
            assert not reader.pdl                    # an NCCL kernel triggers no dependent launch


def test_expert_ids_are_made_local_after_the_router(ranks):
    plan, steps = ranks
    for r, step in enumerate(steps):
        owns = [(g, l) for g, l in _items(step) if isinstance(l, Launch) and l.instance.family == "tp"]
        assert len(owns) == len(plan.parallel.shards[r].experts) == 2
        for g, l in owns:
            i = g.launches.index(l)
            assert g.launches[i - 1].instance.family == "glm_router_topk"
            assert [a.value for a in l.args[1:]] == [2, 4 * r, 4]
        assert "tp_collective.cuh" in step.headers


def test_rank_sources_and_unsplit_sources(ranks, tiny_path):
    plan, _ = ranks
    files = generate(rank_plan(plan, 1), "x").files
    assert "kbp_tp_all_gather(COMM + " in files["src/step.cu"] and "/*tp_ranks*/ 2" in files["src/step.cu"]
    unsplit = build_step(run_pipeline(load_blueprint(tiny_path), Options()), "x")
    assert unsplit.collective_layout is None and unsplit.comm_bytes == 0
    assert not any(isinstance(l, Collective) or isinstance(l, Launch) and l.instance.family == "tp"
                   for _, l in _items(unsplit))
