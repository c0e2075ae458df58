"""The transient hold a claim carries while its VM migrates, as read from its status."""

from __future__ import annotations

from typing import Any

import pytest

from gpuoperator.model import migrations


def test_a_recorded_transient_hold_is_read_back_as_written() -> None:
    hold = migrations.TransientHold(uid="0b6c-uid", target_node="gpu-2")
    claim = {
        "status": {"phase": "Bound", "nodeName": "gpu-1", "migration": migrations.as_status(hold)}
    }
    assert migrations.transient_hold(claim) == hold
    assert claim["status"]["migration"] == {"uid": "0b6c-uid", "targetNode": "gpu-2"}


@pytest.mark.parametrize(
    "status",
    [
        {},
        {"migration": None},
        {"migration": "gpu-2"},
        {"migration": {"uid": "u"}},
        {"migration": {"targetNode": "gpu-2"}},
        {"migration": {"uid": "", "targetNode": "gpu-2"}},
        {"migration": {"uid": 7, "targetNode": "gpu-2"}},
    ],
)
def test_a_claim_without_a_complete_transient_hold_has_none(status: dict[str, Any]) -> None:
    assert migrations.transient_hold({"status": status}) is None
    assert migrations.transient_hold({}) is None
