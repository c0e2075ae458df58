"""Self-managed certificates: what to issue and when, decided from the Secret's facts."""

from __future__ import annotations

import datetime

import pytest

from gpuoperator.model import certificates
from gpuoperator.model.certificates import Cert, Policy, SecretFacts, plan

NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)
SECOND = datetime.timedelta(seconds=1)
NAMES = certificates.serving_names("gpu-operator-webhook", "gpu-operator-system", ["127.0.0.1"])


def cert(
    fp: str,
    issued: datetime.datetime,
    life: datetime.timedelta,
    issuer: str | None = None,
    names: frozenset[str] = frozenset(),
) -> Cert:
    return Cert(
        fingerprint=fp,
        not_before=issued - certificates.BACKDATE,
        not_after=issued + life,
        names=names,
        issuer=issuer,
    )


def healthy(ca_issued: datetime.datetime = NOW - 100 * DAY) -> SecretFacts:
    ca = cert("ca1", ca_issued, 3650 * DAY)
    serving = cert("s1", NOW - 10 * DAY, 365 * DAY, issuer="ca1", names=NAMES)
    return SecretFacts(bundle=(ca,), ca=ca, serving=serving)


def test_the_serving_certificate_names_every_form_of_the_service_and_the_extra_sans() -> None:
    assert {
        "gpu-operator-webhook",
        "gpu-operator-webhook.gpu-operator-system",
        "gpu-operator-webhook.gpu-operator-system.svc",
        "gpu-operator-webhook.gpu-operator-system.svc.cluster.local",
        "127.0.0.1",
    } == NAMES


def test_an_extra_san_that_is_neither_ip_nor_dns_name_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"cert-extra-sans: 'not a name!'.*IP address"):
        certificates.serving_names("svc", "ns", ["not a name!"])


def test_ip_sans_are_compared_in_canonical_form() -> None:
    assert certificates.serving_names("s", "n", ["::0001"]) == certificates.serving_names(
        "s", "n", ["::1"]
    )


@pytest.mark.parametrize(
    ("lifetime", "before"),
    [
        (365 * DAY, 90 * DAY),
        (3650 * DAY, 90 * DAY),
        (90 * DAY, 30 * DAY),
        (30 * SECOND, 10 * SECOND),
    ],
)
def test_renewal_comes_a_third_of_the_lifetime_but_at_most_90_days_before_expiry(
    lifetime: datetime.timedelta, before: datetime.timedelta
) -> None:
    assert certificates.renew_before(lifetime) == before


def test_an_empty_secret_gets_a_ca_and_a_serving_certificate() -> None:
    p = plan(SecretFacts(), NAMES, NOW, injected=True)
    assert p.issue_ca and p.issue_serving
    assert p.bundle == ()
    assert "no CA" in p.reasons


def test_a_healthy_secret_is_left_alone_until_the_serving_certificate_is_due() -> None:
    facts = healthy()
    p = plan(facts, NAMES, NOW, injected=True)
    assert not p.writes
    assert p.bundle == ("ca1",)
    # The next look: the serving certificate's renewal (355 - 90 days away) is beyond the
    # check interval, so the interval decides.
    assert p.next_check == NOW + certificates.CHECK_INTERVAL
    soon = plan(facts, NAMES, NOW + 265 * DAY - datetime.timedelta(hours=6), injected=True)
    assert not soon.writes
    assert soon.next_check == NOW - 10 * DAY + 275 * DAY


def test_a_serving_certificate_due_for_renewal_is_reissued_by_the_same_ca() -> None:
    p = plan(healthy(), NAMES, NOW + 266 * DAY, injected=True)
    assert p.issue_serving and not p.issue_ca
    assert p.bundle == ("ca1",)
    assert "serving certificate due for renewal" in p.reasons


@pytest.mark.parametrize(
    ("serving", "reason"),
    [
        (None, "no serving certificate"),
        (cert("s", NOW - 400 * DAY, 365 * DAY, "ca1", NAMES), "serving certificate expired"),
        (cert("s", NOW, DAY, "ca1", frozenset({"old"})), "serving certificate names differ"),
        (cert("s", NOW, DAY, "elsewhere", NAMES), "not issued by a trusted CA"),
    ],
)
def test_an_unusable_serving_certificate_is_reissued_at_once(
    serving: Cert | None, reason: str
) -> None:
    facts = healthy()
    p = plan(SecretFacts(facts.bundle, facts.ca, serving), NAMES, NOW, injected=False)
    assert p.issue_serving and not p.issue_ca
    assert any(reason in r for r in p.reasons)


def test_a_ca_due_for_renewal_is_rotated_keeping_the_old_one_trusted_and_served() -> None:
    facts = healthy(ca_issued=NOW - 3570 * DAY)  # expires in 80 days: due
    p = plan(facts, NAMES, NOW, injected=True)
    assert p.issue_ca
    assert not p.issue_serving, "the serving certificate waits until the new CA settled"
    assert p.bundle == ("ca1",), "the old CA stays in the bundle after the new one"
    assert p.next_check == NOW + certificates.SETTLE


def test_after_a_rotation_the_serving_certificate_moves_once_the_new_ca_is_injected() -> None:
    old = cert("ca1", NOW - 3570 * DAY, 3650 * DAY)
    new = cert("ca2", NOW, 3650 * DAY)
    serving = cert("s1", NOW - 10 * DAY, 365 * DAY, issuer="ca1", names=NAMES)
    facts = SecretFacts(bundle=(new, old), ca=new, serving=serving)

    waiting = plan(facts, NAMES, NOW + SECOND, injected=False)
    assert not waiting.writes
    assert waiting.next_check == NOW + certificates.SETTLE

    unsettled = plan(facts, NAMES, NOW + SECOND, injected=True)
    assert not unsettled.writes

    settled = plan(facts, NAMES, NOW + certificates.SETTLE, injected=True)
    assert settled.issue_serving and not settled.issue_ca
    assert settled.bundle == ("ca2", "ca1")


def test_an_expired_earlier_ca_is_dropped_from_the_bundle() -> None:
    old = cert("ca1", NOW - 3660 * DAY, 3650 * DAY)
    new = cert("ca2", NOW - 100 * DAY, 3650 * DAY)
    serving = cert("s2", NOW - 10 * DAY, 365 * DAY, issuer="ca2", names=NAMES)
    p = plan(SecretFacts(bundle=(new, old), ca=new, serving=serving), NAMES, NOW, injected=True)
    assert p.rewrite_bundle and not p.issue_ca and not p.issue_serving
    assert p.bundle == ("ca2",)


def test_the_next_look_comes_when_the_earlier_ca_expires() -> None:
    old = cert("ca1", NOW - 3640 * DAY, 3650 * DAY)
    new = cert("ca2", NOW - 10 * DAY, 3650 * DAY)
    serving = cert("s2", NOW - 10 * DAY, 365 * DAY, issuer="ca2", names=NAMES)
    facts = SecretFacts(bundle=(new, old), ca=new, serving=serving)
    p = plan(facts, NAMES, NOW + 10 * DAY - certificates.CHECK_INTERVAL, injected=True)
    assert not p.writes
    assert p.next_check == old.not_after


def test_a_ca_without_its_key_is_replaced_and_a_serving_certificate_follows() -> None:
    facts = healthy()
    p = plan(SecretFacts(bundle=facts.bundle, ca=None, serving=None), NAMES, NOW, injected=True)
    assert p.issue_ca and p.issue_serving


def test_too_short_a_validity_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match=r"--cert-validity.*at least 10s"):
        Policy(serving_validity=datetime.timedelta(seconds=1))


def test_ca_bundle_injection_touches_only_webhooks_whose_bundle_differs() -> None:
    config: certificates.Obj = {
        "metadata": {"name": "v"},
        "webhooks": [
            {"name": "a", "clientConfig": {"url": "https://x/a", "caBundle": "T0xE"}},
            {"name": "b", "clientConfig": {"service": {"name": "s"}}},
        ],
    }
    updated = certificates.with_ca_bundle(config, "TkVX")
    assert updated is not None
    assert [w["clientConfig"] for w in updated["webhooks"]] == [
        {"url": "https://x/a", "caBundle": "TkVX"},
        {"service": {"name": "s"}, "caBundle": "TkVX"},
    ]
    assert config["webhooks"][0]["clientConfig"]["caBundle"] == "T0xE", "input untouched"
    assert certificates.with_ca_bundle(updated, "TkVX") is None
    assert certificates.ca_bundle_holds(updated, "TkVX")
