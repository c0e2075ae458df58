"""Self-managed webhook certificates: what to issue, when to renew, which caBundle to inject.

The operator keeps a CA and a serving certificate in one Secret (``ca.crt``, ``ca.key``,
``tls.crt``, ``tls.key``), as Kueue and Gatekeeper do, and the caBundle of its webhook
configurations equal to ``ca.crt``. This module decides; ``gpuoperator.pki`` does the
cryptography and reads the Secret into the facts below; the controller writes.

Rules (idempotent: the same facts and time give the same plan):

* **Renewal.** A certificate is due ``renew_before(lifetime)`` before it expires: a third of
  its lifetime, but never more than 90 days (a 1-year serving certificate renews 90 days
  before expiry, a 10-year CA too; a 30-second test certificate after 20 seconds).
* **The CA rotates without a gap.** A new CA joins the trust bundle beside the previous one
  (which stays until it expires), and the serving certificate is re-issued from the new CA
  only once every webhook configuration's caBundle holds it and ``settle`` has passed since
  it was issued, so the API server trusts the new certificate before any replica serves it.
  A serving certificate that is unusable (missing, expired, wrong names, not trusted) is
  issued at once: nothing that works can break.
* **Names.** The serving certificate names ``<svc>``, ``<svc>.<ns>``, ``<svc>.<ns>.svc``,
  ``<svc>.<ns>.svc.cluster.local`` and the extra SANs; any other set is re-issued.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]

#: The Secret's keys (cert-manager's and Kueue's layout).
CA_CERT_KEY = "ca.crt"
CA_KEY_KEY = "ca.key"
TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"

CA_VALIDITY = datetime.timedelta(days=3650)
SERVING_VALIDITY = datetime.timedelta(days=365)
#: Renewal happens at most this long before expiry (and at a third of the lifetime if less).
MAX_RENEW_BEFORE = datetime.timedelta(days=90)
#: Certificates are backdated this much, for clocks of the API server behind ours.
BACKDATE = datetime.timedelta(hours=1)
#: After a CA rotation, how long the new CA sits in the caBundle before a serving
#: certificate it issued is served (the API server must have seen the new caBundle).
SETTLE = datetime.timedelta(seconds=10)
MIN_VALIDITY = datetime.timedelta(seconds=10)
#: The longest the controller waits between two looks at the Secret.
CHECK_INTERVAL = datetime.timedelta(hours=12)


@dataclass(frozen=True)
class Cert:
    """What the decisions need of one certificate."""

    fingerprint: str
    not_before: datetime.datetime
    not_after: datetime.datetime
    names: frozenset[str] = frozenset()
    #: Fingerprint of the CA (among the Secret's) whose signature verifies it, if any.
    issuer: str | None = None

    @property
    def issued_at(self) -> datetime.datetime:
        return self.not_before + BACKDATE

    @property
    def renew_at(self) -> datetime.datetime:
        return self.not_after - renew_before(self.not_after - self.issued_at)


@dataclass(frozen=True)
class SecretFacts:
    """The Secret as read: ``bundle`` is ``ca.crt`` (current CA first); ``ca`` is the CA
    whose key is ``ca.key`` (None if absent or mismatched); ``serving`` is ``tls.crt`` if
    ``tls.key`` matches it."""

    bundle: tuple[Cert, ...] = ()
    ca: Cert | None = None
    serving: Cert | None = None


@dataclass(frozen=True)
class Policy:
    ca_validity: datetime.timedelta = CA_VALIDITY
    serving_validity: datetime.timedelta = SERVING_VALIDITY
    settle: datetime.timedelta = SETTLE
    check_interval: datetime.timedelta = CHECK_INTERVAL

    def __post_init__(self) -> None:
        for what, value in (
            ("CA validity (--ca-validity)", self.ca_validity),
            ("serving certificate validity (--cert-validity)", self.serving_validity),
        ):
            if value < MIN_VALIDITY:
                raise ValueError(f"{what}: {value} is too short (allowed: at least 10s)")


@dataclass(frozen=True)
class Plan:
    """What to do now. ``bundle`` lists the fingerprints of the CAs ``ca.crt`` keeps after
    the new CA, if one is issued; ``reasons`` say why, for logs and Events."""

    issue_ca: bool = False
    issue_serving: bool = False
    rewrite_bundle: bool = False
    bundle: tuple[str, ...] = ()
    next_check: datetime.datetime | None = None
    reasons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def writes(self) -> bool:
        return self.issue_ca or self.issue_serving or self.rewrite_bundle


def renew_before(lifetime: datetime.timedelta) -> datetime.timedelta:
    return min(MAX_RENEW_BEFORE, lifetime / 3)


def serving_names(service: str, namespace: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The serving certificate's names: the Service's DNS names and the extra SANs (IP
    addresses in their canonical form)."""
    base = {
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    }
    return frozenset(base | {canonical_name(n) for n in extra})


def canonical_name(name: str) -> str:
    """An IP address in canonical form, a DNS name lower-cased; a clear error otherwise."""
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    labels = name.lower().rstrip(".").split(".")
    if not name or len(name) > 253 or not all(_dns_label(label) for label in labels):
        raise ValueError(
            f"cert-extra-sans: {name!r} is neither an IP address nor a DNS name "
            "(labels of a-z, 0-9 and '-', at most 253 characters)"
        )
    return ".".join(labels)


def _dns_label(label: str) -> bool:
    return (
        0 < len(label) <= 63
        and label[0] != "-"
        and label[-1] != "-"
        and all(c.isascii() and (c.isalnum() or c == "-") for c in label)
    )


def plan(
    facts: SecretFacts,
    wanted_names: frozenset[str],
    now: datetime.datetime,
    *,
    injected: bool,
    policy: Policy | None = None,
) -> Plan:
    """Decide what to issue and what ``ca.crt`` keeps. ``injected``: every webhook
    configuration's caBundle equals the Secret's ``ca.crt`` (vacuously true when none
    exists yet)."""
    policy = policy or Policy()
    reasons: list[str] = []
    checks: list[datetime.datetime] = [now + policy.check_interval]
    ca = facts.ca

    issue_ca = True
    if ca is None:
        reasons.append("no CA")
    elif now >= ca.not_after:
        reasons.append("CA expired")
    elif now >= ca.renew_at:
        reasons.append("CA due for renewal")
    else:
        issue_ca = False
        checks.append(ca.renew_at)

    # ca.crt: the current CA first (a new one, or the kept one), then at most one earlier
    # CA while it is still valid, so what it signed stays trusted across a rotation.
    valid = [c for c in facts.bundle if c.not_after > now]
    if issue_ca:
        earlier = [ca] if ca is not None and ca.not_after > now else []
        earlier += [c for c in valid if c not in earlier]
        kept = earlier[:1]
    else:
        assert ca is not None
        kept = [ca, *[c for c in valid if c != ca][:1]]
    checks += [c.not_after for c in kept if c is not ca or issue_ca]

    serving = facts.serving
    trusted = {c.fingerprint for c in kept}
    usable = (
        serving is not None
        and serving.not_before <= now < serving.not_after
        and serving.names == wanted_names
        and serving.issuer in trusted
    )
    issue_serving = False
    if not usable or serving is None:
        issue_serving = True
        reasons.append(_unusable_reason(serving, wanted_names, trusted, now))
    elif issue_ca:
        # It stays trusted through the earlier CA; it follows the new CA once that settles.
        checks.append(now + policy.settle)
    elif ca is not None and serving.issuer != ca.fingerprint:
        settled = ca.issued_at + policy.settle
        if injected and now >= settled:
            issue_serving = True
            reasons.append("serving certificate issued by the previous CA")
        else:
            checks.append(max(settled, now + datetime.timedelta(seconds=1)))
    elif now >= serving.renew_at:
        issue_serving = True
        reasons.append("serving certificate due for renewal")
    else:
        checks.append(serving.renew_at)

    bundle = tuple(c.fingerprint for c in kept)
    rewrite = not issue_ca and tuple(c.fingerprint for c in facts.bundle) != bundle
    if rewrite:
        reasons.append("CA bundle pruned")
    return Plan(
        issue_ca=issue_ca,
        issue_serving=issue_serving,
        rewrite_bundle=rewrite,
        bundle=bundle,
        next_check=min(checks),
        reasons=tuple(reasons),
    )


def _unusable_reason(
    serving: Cert | None, wanted: frozenset[str], trusted: set[str], now: datetime.datetime
) -> str:
    if serving is None:
        return "no serving certificate"
    if now >= serving.not_after:
        return "serving certificate expired"
    if now < serving.not_before:
        return "serving certificate not yet valid"
    if serving.names != wanted:
        return "serving certificate names differ"
    return "serving certificate not issued by a trusted CA"


# ---- caBundle of webhook configurations --------------------------------------------------
def ca_bundle_holds(configuration: Obj, bundle_b64: str) -> bool:
    """Every webhook of ``configuration`` has exactly ``bundle_b64`` as its caBundle."""
    return all(
        (w.get("clientConfig") or {}).get("caBundle") == bundle_b64
        for w in configuration.get("webhooks") or []
    )


def with_ca_bundle(configuration: Obj, bundle_b64: str) -> Obj | None:
    """A copy of ``configuration`` whose every webhook carries ``bundle_b64``, or None when
    nothing would change."""
    if ca_bundle_holds(configuration, bundle_b64):
        return None
    webhooks = []
    for w in configuration.get("webhooks") or []:
        client_config = {**(w.get("clientConfig") or {}), "caBundle": bundle_b64}
        webhooks.append({**w, "clientConfig": client_config})
    return {**configuration, "webhooks": webhooks}
