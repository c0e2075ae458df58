"""The ``drainMoves`` setting: on by default, off from the ConfigMap, the environment or the
flag, and a value that is not a boolean is a clear startup error."""

from __future__ import annotations

import pytest

from gpuoperator import settings


def test_moves_are_on_by_default() -> None:
    assert settings.load(None, {}, {}).drain_moves is True


@pytest.mark.parametrize(
    ("cm", "env", "flags"),
    [
        ({"drainMoves": "false"}, {}, {}),
        ({"drainMoves": "true"}, {"GPUOP_DRAIN_MOVES": "false"}, {}),
        ({}, {"GPUOP_DRAIN_MOVES": "true"}, {"drainMoves": False}),
    ],
)
def test_every_source_turns_moves_off(
    cm: dict[str, str], env: dict[str, str], flags: dict[str, object]
) -> None:
    assert settings.load(cm, env, flags).drain_moves is False


def test_a_bad_value_names_the_setting_and_its_source() -> None:
    with pytest.raises(settings.SettingsError) as err:
        settings.load({"drainMoves": "sometimes"}, {}, {})
    assert "drainMoves='sometimes'" in str(err.value)
    assert "ConfigMap" in str(err.value)
