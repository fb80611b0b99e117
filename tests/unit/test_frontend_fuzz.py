"""Random mutations of a valid blueprint: loading either succeeds or raises the project's own
error type, never anything else (no KeyError, TypeError, ... escaping as a traceback)."""
from __future__ import annotations

import copy
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbpc.errors import KbpcError
from kbpc.frontend.load import blueprint_from_doc

from conftest import TINY_BLUEPRINT

DOC = json.loads(TINY_BLUEPRINT.read_text())
SECTIONS = ("nodes", "edges", "groups", "layers")
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.text(max_size=12),
                   st.lists(st.integers(-2, 200), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


@st.composite
def mutations(draw):
    doc = copy.deepcopy(DOC)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["set", "delete", "drop_item", "dup_item", "top"]))
        section = draw(st.sampled_from(SECTIONS))
        items = doc.get(section)
        if not isinstance(items, list) or not items:
            continue   # an earlier mutation replaced or emptied this section
        i = draw(st.integers(0, len(items) - 1))
        if kind == "drop_item":
            items.pop(i)
        elif kind == "dup_item":
            items.insert(draw(st.integers(0, len(items))), copy.deepcopy(items[i]))
        elif kind == "top":
            doc[draw(st.sampled_from(sorted(doc)))] = draw(VALUES)
        elif isinstance(items[i], dict):
            key = draw(st.sampled_from(sorted(items[i])))
            if kind == "delete":
                del items[i][key]
            else:
                items[i][key] = draw(VALUES)
    return doc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations())
def test_mutated_blueprints_load_or_raise_kbpc_error(doc):
    try:
        blueprint_from_doc(doc, "mutant.json")
    except KbpcError as exc:
        assert str(exc).startswith("mutant.json")
