"""Gathering a VM's claims on one node: the node holding most units is tried first, and a
target must exist, be eligible for every moving claim's class, not be refused by one, and
have free units of each resource for all of them together."""

from __future__ import annotations

import datetime
from typing import Any

from gpuoperator.model import gathering

Obj = dict[str, Any]
NOW = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)
RESOURCES = {"a10": "x.com/a10", "a10-big": "x.com/a10", "l40s": "x.com/l40s"}


def claim(name: str, node: str, count: int = 1, class_name: str = "a10", **status: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"className": class_name, "count": count},
        "status": {"phase": "Bound", "nodeName": node, **status},
    }


def test_the_node_holding_most_units_is_the_target() -> None:
    claims = [claim("a", "n1"), claim("b", "n2", 2)]
    plan = gathering.gather(claims, {"n1": {"a10": 0}, "n2": {"a10": 1}}, RESOURCES, NOW)
    assert plan == gathering.Gathering("n2", [claims[0]])


def test_the_next_node_is_tried_when_the_first_cannot_take_the_others() -> None:
    claims = [claim("a", "n1"), claim("b", "n2", 2)]
    plan = gathering.gather(claims, {"n1": {"a10": 2}, "n2": {"a10": 0}}, RESOURCES, NOW)
    assert plan.target == "n1"
    assert plan.moving == [claims[1]]


def test_needs_add_up_per_resource_across_classes() -> None:
    claims = [claim("big", "n1", 3), claim("a", "n2"), claim("b", "n3", class_name="a10-big")]
    free = {"n1": {"a10": 1, "a10-big": 1}, "n2": {"a10": 9}, "n3": None}
    plan = gathering.gather(claims, free, RESOURCES, NOW)
    assert plan.target is None
    assert plan.why == (
        "n1: 2 units of x.com/a10 needed, 1 free; "
        "n2: it is not eligible for class a10-big of claim b; n3: the node is gone"
    )


def test_a_refused_or_unknown_class_target_is_skipped() -> None:
    until = (NOW + datetime.timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
    refused = claim("a", "n1", refusedNodes=[{"nodeName": "n2", "until": until}])
    unknown = claim("u", "n2", 2, class_name="gone")
    assert gathering.misfit("n2", [refused], {"a10": 5}, RESOURCES, NOW) == (
        f"claim a skips it until {until} (refused)"
    )
    assert gathering.misfit("n1", [unknown], {"a10": 5}, RESOURCES, NOW) == (
        "class gone of claim u is unknown"
    )
    assert gathering.misfit("n1", [claim("c", "n2")], {"a10": 1}, RESOURCES, NOW) is None
