"""Limits refuse values out of range, naming the field."""

from __future__ import annotations

import pytest

from gpuoperator.runtime import serving


def test_limits_name_the_field_that_is_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"Limits\.header_timeout: 0"):
        serving.Limits(header_timeout=0)
    with pytest.raises(ValueError, match=r"Limits\.max_body"):
        serving.Limits(max_body=10, max_buffered_bytes=5)
