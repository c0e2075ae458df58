"""Small helpers over pykube-ng for tests: clients, raw apply, refusal capture."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykube
import yaml

Obj = dict[str, Any]


def client(kubeconfig: Path) -> pykube.HTTPClient:
    return pykube.HTTPClient(pykube.KubeConfig.from_file(str(kubeconfig)), timeout=30)


def load_yaml(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@dataclass
class Refusal:
    """What the API server said when it refused a request."""

    code: int
    message: str

    def names(self, *fragments: str) -> bool:
        return all(f in self.message for f in fragments)


@contextmanager
def refused(code: int = 422) -> Iterator[list[Refusal]]:
    """``with refused() as r: ...`` expects the block to fail with an HTTP error ``code``.

    ``r[0]`` then holds the refusal, for asserting on its message.
    """
    box: list[Refusal] = []
    try:
        yield box
    except pykube.exceptions.HTTPError as exc:
        box.append(Refusal(exc.code, str(exc)))
        if exc.code != code:
            raise AssertionError(f"expected HTTP {code}, got {exc.code}: {exc}") from exc
    else:
        raise AssertionError(f"expected the API server to refuse with HTTP {code}, it accepted")


def with_changes(obj: Obj, **paths: Any) -> Obj:
    """A deep copy of ``obj`` with dotted paths set (``spec__vendor="x"``); None deletes."""
    out = copy.deepcopy(obj)
    for dotted, value in paths.items():
        keys = dotted.split("__")
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        if value is None:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = value
    return out


def replace(o: pykube.objects.APIObject, subresource: str | None = None) -> None:
    """PUT the whole object (pykube's ``update`` sends a merge patch, which cannot remove
    a field); the resourceVersion it carries makes a stale write fail with 409."""
    r = o.api.put(**o.api_kwargs(subresource=subresource, data=json.dumps(o.obj)))
    o.api.raise_for_status(r)
    o.set_obj(r.json())


def mutate(
    o: pykube.objects.APIObject,
    change: Callable[[Obj], None],
    subresource: str | None = None,
    timeout: float = 15.0,
) -> None:
    """Re-read, ``change`` and PUT the object until no other writer raced us (409)."""

    def attempt() -> bool:
        o.reload()
        change(o.obj)
        try:
            replace(o, subresource=subresource)
        except pykube.exceptions.HTTPError as exc:
            if exc.code == 409:
                return False
            raise
        return True

    from harness.waiting import wait_for

    wait_for(f"an uncontended update of {o.kind} {o.name}", attempt, timeout=timeout)
