"""Settings: sources in order, and one clear error for a bad value; ``drainMoves`` on by
default and off from any source."""

from __future__ import annotations

import pytest

from gpuoperator import settings


def test_defaults() -> None:
    s = settings.load(None, {}, {})
    assert s.placement_policy == "binpack"
    assert s.refusal_ttl == 600.0
    assert s.gpu_for_vms is True
    assert s.license_namespace == "gpu-licenses"
    assert s.kubevirt_service_account == "system:serviceaccount:kubevirt:kubevirt-controller"
    assert s.exempt_namespaces == ()
    assert s.webhook_client_ca == ""
    assert s.gpu_hours_series == "claim"


def test_exempt_namespaces_are_a_comma_separated_set_of_names() -> None:
    s = settings.load({"exemptNamespaces": " hoster, kube-system,,hoster"}, {}, {})
    assert s.exempt_namespaces == ("hoster", "kube-system")
    with pytest.raises(settings.SettingsError, match=r"exemptNamespaces=.*'Tenant_A' is not a"):
        settings.load({"exemptNamespaces": "Tenant_A"}, {}, {})


def test_the_license_namespace_cannot_be_empty() -> None:
    with pytest.raises(settings.SettingsError, match=r"licenseNamespace=''"):
        settings.load({"licenseNamespace": ""}, {}, {})


def test_flags_override_environment_override_configmap() -> None:
    cm = {"placementPolicy": "spread", "refusalTTL": "5m", "gpuForVMs": "false"}
    env = {"GPUOP_REFUSAL_TTL": "90s", "GPUOP_PLACEMENT_POLICY": "binpack"}
    s = settings.load(cm, env, {"placementPolicy": "spread", "refusalTTL": None})
    assert s.placement_policy == "spread"  # flag
    assert s.refusal_ttl == 90.0  # environment beats the ConfigMap
    assert s.gpu_for_vms is False  # ConfigMap


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10m", 600), ("90s", 90), ("1h30m", 5400), ("1.5h", 5400), ("45", 45), ("2m30s", 150)],
)
def test_durations(text: str, seconds: float) -> None:
    assert settings.parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("source", "fragments"),
    [
        (
            {"cm": {"placementPolicy": "pack"}},
            ("placementPolicy='pack'", "ConfigMap", "'binpack' or 'spread'"),
        ),
        (
            {"env": {"GPUOP_REFUSAL_TTL": "soon"}},
            ("refusalTTL='soon'", "GPUOP_REFUSAL_TTL", "duration such as 10m"),
        ),
        ({"flags": {"refusalTTL": "0s"}}, ("refusalTTL='0s'", "flag --refusal-ttl", "positive")),
        ({"cm": {"gpuForVMs": "maybe"}}, ("gpuForVMs='maybe'", "ConfigMap", "boolean")),
        ({"cm": {"licenseNamespace": "Not_A_Namespace"}}, ("licenseNamespace", "pattern")),
        ({"cm": {"placementPolcy": "spread"}}, ("unknown setting 'placementPolcy'", "known:")),
    ],
    ids=["policy", "ttl-env", "ttl-zero-flag", "bool", "namespace", "typo"],
)
def test_a_bad_value_is_one_error_naming_setting_value_source_and_allowed(
    source: dict[str, dict[str, str]], fragments: tuple[str, ...]
) -> None:
    with pytest.raises(settings.SettingsError) as err:
        settings.load(
            source.get("cm"),
            source.get("env", {}),
            source.get("flags", {}),
            configmap_ref="ConfigMap gpu-operator/gpu-operator-settings",
        )
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


# ---- drainMoves: on by default, off from any source, and a non-boolean is a startup error
def test_drain_moves_are_on_by_default() -> None:
    assert settings.load(None, {}, {}).drain_moves is True


@pytest.mark.parametrize(
    ("cm", "env", "flags"),
    [
        ({"drainMoves": "false"}, {}, {}),
        ({"drainMoves": "true"}, {"GPUOP_DRAIN_MOVES": "false"}, {}),
        ({}, {"GPUOP_DRAIN_MOVES": "true"}, {"drainMoves": False}),
    ],
)
def test_every_source_turns_drain_moves_off(
    cm: dict[str, str], env: dict[str, str], flags: dict[str, object]
) -> None:
    assert settings.load(cm, env, flags).drain_moves is False


def test_a_bad_drain_moves_value_names_the_setting_and_its_source() -> None:
    with pytest.raises(settings.SettingsError) as err:
        settings.load({"drainMoves": "sometimes"}, {}, {})
    assert "drainMoves='sometimes'" in str(err.value)
    assert "ConfigMap" in str(err.value)
