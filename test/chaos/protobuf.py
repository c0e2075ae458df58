"""ResourceClaims as etcd stores them: Kubernetes' protobuf encoding, read with a decoder of
its own (the wire format, and the few field numbers the record needs).

kube-apiserver stores built-in kinds (``resource.k8s.io`` included) as protobuf, custom
resources as JSON. A stored value is the magic ``k8s\\x00`` and a ``runtime.Unknown``
message (``typeMeta`` = 1, ``raw`` = 2); ``raw`` is the object. The field numbers below are
those of ``k8s.io/api/resource/v1`` and ``k8s.io/apimachinery/pkg/apis/meta/v1``
(``generated.proto``); a value that is JSON is read as JSON.

The result has the shape the API server serves as JSON, limited to what the chaos checks
read: ``metadata`` (name, namespace, uid, deletionTimestamp present, ownerReferences with
kind, name, uid, controller) and ``status.allocation`` (``devices.results`` with request,
driver, pool, device, adminAccess; ``nodeSelector`` terms with their requirements).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

Obj = dict[str, Any]
MAGIC = b"k8s\x00"
#: A field's values, in order, by field number: varints as int, the rest as bytes.
Fields = dict[int, list[int | bytes]]


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data):
            raise ValueError("protobuf: a varint runs past the end")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError("protobuf: a varint longer than 10 bytes")


def fields(data: bytes) -> Fields:
    """One message's fields (wire types 0, 1, 2 and 5; groups are not used by Kubernetes)."""
    out: Fields = defaultdict(list)
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, at = _varint(data, at)
            out[number].append(value)
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ValueError(f"protobuf: field {number} runs past the end")
            out[number].append(data[at : at + size])
            at += size
        elif wire == 1:
            out[number].append(data[at : at + 8])
            at += 8
        elif wire == 5:
            out[number].append(data[at : at + 4])
            at += 4
        else:
            raise ValueError(f"protobuf: wire type {wire} of field {number}")
    return out


def _bytes(f: Fields, number: int) -> bytes:
    values = [v for v in f.get(number, []) if isinstance(v, bytes)]
    return values[-1] if values else b""


def _text(f: Fields, number: int) -> str:
    return _bytes(f, number).decode()


def _texts(f: Fields, number: int) -> list[str]:
    return [v.decode() for v in f.get(number, []) if isinstance(v, bytes)]


def _flag(f: Fields, number: int) -> bool:
    values = [v for v in f.get(number, []) if isinstance(v, int)]
    return bool(values and values[-1])


def _messages(f: Fields, number: int) -> list[Fields]:
    return [fields(v) for v in f.get(number, []) if isinstance(v, bytes)]


def _metadata(f: Fields) -> Obj:
    meta: Obj = {"name": _text(f, 1), "namespace": _text(f, 3), "uid": _text(f, 5)}
    if 9 in f:
        meta["deletionTimestamp"] = "set"  # a meta.v1.Time; only its presence is read
    meta["ownerReferences"] = [
        {"kind": _text(r, 1), "name": _text(r, 3), "uid": _text(r, 4), "controller": _flag(r, 6)}
        for r in _messages(f, 13)
    ]
    return meta


def _requirement(f: Fields) -> Obj:
    return {"key": _text(f, 1), "operator": _text(f, 2), "values": _texts(f, 3)}


def _allocation(f: Fields) -> Obj:
    results = [
        {
            "request": _text(r, 1),
            "driver": _text(r, 2),
            "pool": _text(r, 3),
            "device": _text(r, 4),
            "adminAccess": _flag(r, 5),
        }
        for d in _messages(f, 1)
        for r in _messages(d, 1)
    ]
    terms = [
        {
            "matchExpressions": [_requirement(r) for r in _messages(t, 1)],
            "matchFields": [_requirement(r) for r in _messages(t, 2)],
        }
        for s in _messages(f, 3)
        for t in _messages(s, 1)
    ]
    out: Obj = {"devices": {"results": results}}
    if 3 in f:
        out["nodeSelector"] = {"nodeSelectorTerms": terms}
    return out


def resource_claim(value: bytes) -> Obj:
    """A stored ResourceClaim (protobuf or JSON) in the API's JSON shape (see above)."""
    if value[:1] == b"{":
        obj: Obj = json.loads(value)
        return obj
    if not value.startswith(MAGIC):
        raise ValueError(f"not a Kubernetes protobuf value: {value[:8]!r}")
    claim = fields(_bytes(fields(value[len(MAGIC) :]), 2))
    status = _messages(claim, 3)
    out: Obj = {"metadata": _metadata(_messages(claim, 1)[-1] if 1 in claim else {}), "status": {}}
    if status and 1 in status[-1]:
        out["status"]["allocation"] = _allocation(_messages(status[-1], 1)[-1])
    return out
