"""The ``needs_tools`` marker is exact: `make unit` deselects it and must run where no Go-built
binary exists, so a test that reaches for one without the marker fails, naming the marker."""

from __future__ import annotations

import pytest
from unit.config import manifests


def test_an_unmarked_test_may_not_render_the_manifests() -> None:
    with pytest.raises(pytest.fail.Exception, match="needs_tools"):
        manifests.render("default")


def test_an_unmarked_test_may_not_run_a_static_check_tool() -> None:
    with pytest.raises(pytest.fail.Exception, match="needs_tools"):
        manifests.tool("promtool")


@pytest.mark.needs_tools
def test_a_marked_test_reaches_the_pinned_kubectl() -> None:
    assert manifests.pinned_kubectl().is_file()
