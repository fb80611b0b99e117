"""Programmatic dependent launch across a cross-stream event wait inside a CUDA graph (what
`kbpc compile --pdl-across-events` issues): a reader launched with PDL right after waiting on
another stream's event, which calls kbp::pdl_wait() before reading, must see everything the other
stream's slow writer wrote, in every replay; the graph must instantiate. The capture's edges are
printed (run with -s): which of the reader's incoming edges capture made programmatic. The graph
and its kernels: kbpc/testing/pdl_events.py."""
from __future__ import annotations

import pytest

from kbpc.testing.pdl_events import EDGE_PROGRAMMATIC, VALUE, build, run

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return build(tmp_path_factory.mktemp("pdl_events"))


@pytest.mark.parametrize("reader_pdl", [True, False], ids=["pdl", "no-pdl"])
def test_reader_after_an_event_wait_sees_the_writer(library, reader_pdl):
    for spin_ns in (0, 20_000, 200_000):
        r = run(library, reps=30, n=4096, spin_ns=spin_ns, reader_pdl=reader_pdl)
        print(f"reader_pdl={reader_pdl} spin={spin_ns} ns: edge from a_first (type, port) {r.first_edge}, "
              f"from slow_writer across the event {r.writer_edge}; wrong reads {r.bad}")
        assert r.bad == 0, f"{r.bad} wrong reads over 30 replays (spin {spin_ns} ns)"
        assert r.out == tuple(VALUE + i for i in range(4096))


def test_capture_edges_of_a_pdl_launch_after_an_event_wait(library):
    """The same-stream edge of a PDL launch is programmatic (documented); the edge from the other
    stream's kernel is reported, not assumed. A plain launch gets full edges only."""
    pdl, plain = run(library, reps=1, reader_pdl=True), run(library, reps=1, reader_pdl=False)
    print(f"PDL reader: from a_first {pdl.first_edge}, from slow_writer {pdl.writer_edge}; "
          f"plain reader: {plain.first_edge}, {plain.writer_edge}  (type 1 = programmatic; port 1 = "
          "programmatic, 2 = launch completion)")
    assert plain.first_edge == (0, 0) and plain.writer_edge == (0, 0)
    assert pdl.writer_edge[0] in (0, EDGE_PROGRAMMATIC), "the reader lost its edge from the writer"
    assert pdl.first_edge[0] == EDGE_PROGRAMMATIC, (
        "capture did not make even the same-stream edge programmatic after an event wait: "
        "--pdl-across-events cannot gain anything")


def test_probe_without_pdl_wait_shows_whether_the_writer_edge_overlaps(library):
    """A reader that skips pdl_wait() (against the kernel contract, on purpose) reads early only if
    its edge from the writer is programmatic; with a full edge it must still see every value."""
    r = run(library, reps=30, spin_ns=200_000, reader_pdl=True, reader_waits=False)
    print(f"reader without pdl_wait: edge from the writer {r.writer_edge}, wrong reads {r.bad} over 30 replays")
    if r.writer_edge[0] != EDGE_PROGRAMMATIC:
        assert r.bad == 0, "a full edge from the writer still let the reader read early"
