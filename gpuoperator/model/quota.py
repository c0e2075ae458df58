"""Budget keys (docs/design.md §3, §4): built and parsed in one place.

Budgets are ``ResourceQuota`` ``spec.hard`` entries in a tenant namespace:
``<class>.gpuclass.cozystack.io/devices`` per class and ``gpuclass.cozystack.io/devices``
for all classes. They are deliberately not ``requests.*``/``limits.*`` keys (a ``limits.*``
entry switches on KubeVirt's automatic resource limits for every VM in the namespace), so a
key with such a prefix is never read as a budget, even one that would otherwise parse.

A class name is a DNS label and never ``total`` (the GPUClass schema says so), so a key whose
class part is not a DNS label, or is ``total``, ``requests`` or ``limits``, is not a budget.

Every function is pure and idempotent.
"""

from __future__ import annotations

import re
from typing import Final, Literal

from gpuoperator import names

#: The budget over all classes of a namespace.
TOTAL_KEY: Final = names.QUOTA_TOTAL_KEY

_CLASS_SUFFIX: Final = "." + names.QUOTA_TOTAL_KEY
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: Class parts that never name a class's budget: ``total`` is refused as a class name;
#: ``requests``/``limits`` would read as ResourceQuota's own request and limit prefixes.
_NOT_CLASSES: Final = frozenset({"total", "requests", "limits"})

ParsedKey = tuple[Literal["class"], str] | tuple[Literal["total"], None]


def class_key(class_name: str) -> str:
    """The per-class budget key: ``<class>.gpuclass.cozystack.io/devices``."""
    return names.quota_key(class_name)


def parse_key(key: str) -> ParsedKey | None:
    """What a ``spec.hard`` key budgets: ``("class", name)``, ``("total", None)``, or
    ``None`` for every other key (CPU, memory, ``requests.*``/``limits.*``, object counts...)."""
    if key == TOTAL_KEY:
        return ("total", None)
    if not key.endswith(_CLASS_SUFFIX):
        return None
    class_name = key[: -len(_CLASS_SUFFIX)]
    if class_name in _NOT_CLASSES or not _DNS_LABEL.fullmatch(class_name):
        return None
    return ("class", class_name)
