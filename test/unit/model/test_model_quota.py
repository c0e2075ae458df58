"""Budget keys are built and parsed one way (docs/design.md §3, §4); keys with ResourceQuota's own
``requests.``/``limits.`` prefixes never read as budgets."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuoperator.model import quota


def test_keys_are_the_contracts() -> None:
    assert quota.TOTAL_KEY == "gpuclass.cozystack.io/devices"
    assert quota.class_key("a10") == "a10.gpuclass.cozystack.io/devices"


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        pytest.param("gpuclass.cozystack.io/devices", ("total", None), id="total"),
        pytest.param("a10.gpuclass.cozystack.io/devices", ("class", "a10"), id="class"),
        pytest.param("l40s-24q.gpuclass.cozystack.io/devices", ("class", "l40s-24q"), id="dash"),
        pytest.param("9.gpuclass.cozystack.io/devices", ("class", "9"), id="digit-label"),
        pytest.param(f"{'a' * 63}.gpuclass.cozystack.io/devices", ("class", "a" * 63), id="63"),
        pytest.param(f"{'a' * 64}.gpuclass.cozystack.io/devices", None, id="64-too-long"),
        pytest.param("requests.a10.gpuclass.cozystack.io/devices", None, id="requests-class"),
        pytest.param("limits.a10.gpuclass.cozystack.io/devices", None, id="limits-class"),
        pytest.param("requests.gpuclass.cozystack.io/devices", None, id="requests-total"),
        pytest.param("limits.gpuclass.cozystack.io/devices", None, id="limits-total"),
        pytest.param("total.gpuclass.cozystack.io/devices", None, id="total-is-no-class"),
        pytest.param("a.b.gpuclass.cozystack.io/devices", None, id="dotted-class"),
        pytest.param("A10.gpuclass.cozystack.io/devices", None, id="uppercase"),
        pytest.param("-a.gpuclass.cozystack.io/devices", None, id="leading-dash"),
        pytest.param("a-.gpuclass.cozystack.io/devices", None, id="trailing-dash"),
        pytest.param(".gpuclass.cozystack.io/devices", None, id="empty-class"),
        pytest.param("a10.gpuclass.cozystack.io/other", None, id="other-name"),
        pytest.param("a10.gpu.cozystack.io/devices", None, id="other-domain"),
        pytest.param("xgpuclass.cozystack.io/devices", None, id="glued-prefix"),
        pytest.param("requests.nvidia.com/GA102GL_A10", None, id="raw-resource"),
        pytest.param("cpu", None, id="cpu"),
        pytest.param("", None, id="empty"),
    ],
)
def test_parse_key(key: str, expected: tuple[str, str | None] | None) -> None:
    assert quota.parse_key(key) == expected


dns_labels = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True).filter(
    lambda name: name not in {"total", "requests", "limits"}
)


@settings(max_examples=150, deadline=None)
@given(dns_labels)
def test_every_class_key_parses_back_to_its_class(name: str) -> None:
    assert quota.parse_key(quota.class_key(name)) == ("class", name)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=string.ascii_letters + string.digits + "./-_", max_size=60))
def test_a_parsed_class_key_is_built_back_exactly(key: str) -> None:
    parsed = quota.parse_key(key)
    if parsed is not None and parsed[0] == "class":
        assert parsed[1] is not None
        assert quota.class_key(parsed[1]) == key
