"""Loading a kubeconfig: inline client keys end up in files only the owner can read, and a
missing file is named."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from gpuoperator.runtime.kubeconfig import load_config


def test_inline_client_keys_are_written_readable_by_the_owner_only(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [
                    {"name": "u", "user": {"client-key-data": base64.b64encode(b"KEY").decode()}}
                ],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    config = load_config(str(kubeconfig))
    key = Path(config.doc["users"][0]["user"]["client-key"])
    assert key.read_bytes() == b"KEY"
    assert key.stat().st_mode & 0o077 == 0
    assert key.parent.stat().st_mode & 0o077 == 0


def test_a_missing_kubeconfig_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        load_config(str(tmp_path / "nope"))
