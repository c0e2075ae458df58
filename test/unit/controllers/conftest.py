"""Fixtures shared by the controller tests: ``world``, the VMs' controllers on in-memory
caches and a fake API server (``harness.vm_controllers``). A test file that defines its own
``world`` uses that one."""

from __future__ import annotations

import pytest

from harness.vm_controllers import World


@pytest.fixture
def world() -> World:
    return World()
