"""Where a client's configuration comes from: a kubeconfig file, or the pod's service
account.

A kubeconfig's inline ``client-key-data`` is written to a file only this process's user can
read, in a private directory removed at exit (pykube would put it under the shared temp
directory with default permissions).
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pykube
import yaml

#: Where a pod's service-account token and CA are mounted.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def load_config(kubeconfig: str | None = None) -> pykube.KubeConfig:
    """A kubeconfig file (``kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``), or
    the pod's service account when none exists and we run in a cluster."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if not Path(path).exists():
        if kubeconfig:
            raise FileNotFoundError(f"kubeconfig {kubeconfig} does not exist")
        if (SERVICE_ACCOUNT_DIR / "token").exists():
            return pykube.KubeConfig.from_service_account()
        raise FileNotFoundError(f"no kubeconfig at {path} and not running in a pod")
    doc = yaml.safe_load(Path(path).read_text())
    _move_inline_keys(doc)
    config = pykube.KubeConfig(doc)
    config.filepath = Path(path)  # relative certificate paths resolve against it
    return config


_private_dir: Path | None = None


def _move_inline_keys(doc: dict[str, Any]) -> None:
    """Write inline ``client-key-data`` to a 0600 file in a private directory (pykube would
    put it under the shared temp dir with default permissions)."""
    global _private_dir  # noqa: PLW0603 - one private directory per process
    for user in doc.get("users") or []:
        u = user.get("user") or {}
        data = u.pop("client-key-data", None)
        if data is None:
            continue
        if _private_dir is None:
            _private_dir = Path(tempfile.mkdtemp(prefix="gpuoperator-"))
            atexit.register(shutil.rmtree, _private_dir, True)
        key = _private_dir / f"{user.get('name', 'user')}.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(data))
        u["client-key"] = str(key)
