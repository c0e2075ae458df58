"""Scrape authorisation: 401 without or with a rejected token, 403 without RBAC, cached
decisions, fail closed when the API server cannot answer."""

from __future__ import annotations

from typing import Any

import pytest

from gpuoperator.runtime import errors
from gpuoperator.runtime.authorizing import Authorizer
from gpuoperator.runtime.clock import FakeClock


class Reviews:
    """Answers TokenReview and SubjectAccessReview like the API server would."""

    def __init__(self, tokens: dict[str, str], allowed: set[str], down: bool = False) -> None:
        self.tokens, self.allowed, self.down = tokens, allowed, down
        self.calls: list[str] = []

    def review(self, kind: Any, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(body["kind"])
        if self.down:
            raise errors.ApiError(503, "ServiceUnavailable", "apiserver down")
        if body["kind"] == "TokenReview":
            user = self.tokens.get(body["spec"]["token"])
            if user is None:
                return {"status": {"authenticated": False, "error": "invalid bearer token"}}
            return {"status": {"authenticated": True, "user": {"username": user}}}
        ok = body["spec"]["user"] in self.allowed and body["spec"]["nonResourceAttributes"] == {
            "path": "/metrics",
            "verb": "get",
        }
        return {"status": {"allowed": ok}}


def authorizer(reviews: Reviews, clock: FakeClock | None = None) -> Authorizer:
    return Authorizer(reviews, clock=clock or FakeClock())


def test_no_token_is_401_without_asking_the_api_server() -> None:
    reviews = Reviews({}, set())
    assert authorizer(reviews).authorize(None, "/metrics").status == 401
    assert authorizer(reviews).authorize("Basic abc", "/metrics").status == 401
    assert reviews.calls == []


def test_a_token_the_api_server_rejects_is_401() -> None:
    d = authorizer(Reviews({}, set())).authorize("Bearer forged", "/metrics")
    assert (d.status, d.reason) == (401, "invalid bearer token")


def test_an_authenticated_user_without_rbac_is_403_and_named() -> None:
    d = authorizer(Reviews({"t": "alice"}, set())).authorize("Bearer t", "/metrics")
    assert d.status == 403 and "alice may not get /metrics" in d.reason


def test_an_allowed_user_is_200_and_the_decision_is_cached_briefly() -> None:
    reviews, clock = Reviews({"t": "prometheus"}, {"prometheus"}), FakeClock()
    auth = authorizer(reviews, clock)
    assert auth.authorize("Bearer t", "/metrics").status == 200
    assert auth.authorize("Bearer t", "/metrics").status == 200
    assert reviews.calls == ["TokenReview", "SubjectAccessReview"]
    clock.advance(11)
    auth.authorize("Bearer t", "/metrics")
    assert len(reviews.calls) == 4


def test_when_the_api_server_cannot_answer_the_scrape_is_503_and_not_cached() -> None:
    reviews, clock = Reviews({"t": "prometheus"}, {"prometheus"}, down=True), FakeClock()
    auth = authorizer(reviews, clock)
    assert auth.authorize("Bearer t", "/metrics").status == 503
    reviews.down = False
    clock.advance(3)  # past the outage window
    assert auth.authorize("Bearer t", "/metrics").status == 200


class Broken:
    """A reviewer failing the way a transport does, not the way the API server does."""

    def __init__(self, error: Exception | None = None, answer: Any = None) -> None:
        self.error, self.answer, self.calls = error, answer, 0

    def review(self, kind: Any, body: dict[str, Any]) -> Any:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.answer


@pytest.mark.parametrize(
    "reviewer",
    [
        Broken(ConnectionRefusedError("connection refused")),
        Broken(ConnectionResetError("connection reset by peer")),
        Broken(ValueError("Expecting value: line 1 column 1 (char 0)")),  # not JSON
        Broken(TimeoutError("read timed out")),
        Broken(answer="not an object"),
        Broken(answer={"status": "authenticated"}),
        Broken(answer={"status": {"authenticated": True, "user": "alice"}}),
    ],
    ids=[
        "refused",
        "reset",
        "not-json",
        "timeout",
        "not-an-object",
        "status-a-string",
        "user-a-string",
    ],
)
def test_every_reviewer_failure_is_401_or_503_never_an_exception(reviewer: Broken) -> None:
    d = Authorizer(reviewer, clock=FakeClock()).authorize("Bearer t", "/metrics")
    assert d.status in (401, 503), d
    assert "connection" not in d.message and "Expecting" not in d.message


def test_the_401_body_says_nothing_of_the_reviewers_error() -> None:
    reviews = Reviews({}, set())
    d = authorizer(reviews).authorize("Bearer forged", "/metrics")
    assert d.status == 401
    assert "invalid bearer token" in d.reason  # for the log
    assert "invalid" not in d.message and "bearer token is required" in d.message


def test_a_rejected_token_is_cached_so_replaying_it_costs_no_review() -> None:
    reviews = Reviews({}, set())
    auth = authorizer(reviews)
    for _ in range(20):
        assert auth.authorize("Bearer forged", "/metrics").status == 401
    assert reviews.calls == ["TokenReview"]


def test_one_source_gets_a_burst_of_unknown_tokens_then_429_while_others_still_pass() -> None:
    reviews, clock = Reviews({"good": "prometheus"}, {"prometheus"}), FakeClock()
    auth = Authorizer(reviews, clock=clock, per_source_burst=5, per_source_rate=1.0)
    statuses = [
        auth.authorize(f"Bearer r{i}", "/metrics", source="10.0.0.9").status for i in range(8)
    ]
    assert statuses == [401] * 5 + [429] * 3
    assert reviews.calls.count("TokenReview") == 5
    assert auth.authorize("Bearer good", "/metrics", source="10.0.0.1").status == 200
    clock.advance(1)
    assert auth.authorize("Bearer r99", "/metrics", source="10.0.0.9").status == 401


def test_all_sources_together_are_bounded_too() -> None:
    reviews, clock = Reviews({}, set()), FakeClock()
    auth = Authorizer(reviews, clock=clock, total_burst=10, total_rate=1.0)
    statuses = [
        auth.authorize(f"Bearer r{i}", "/metrics", source=f"10.0.{i}.1").status for i in range(15)
    ]
    assert statuses.count(429) == 5 and reviews.calls.count("TokenReview") == 10


def test_during_an_outage_new_tokens_are_refused_without_asking_again() -> None:
    reviews, clock = Reviews({}, set(), down=True), FakeClock()
    auth = authorizer(reviews, clock)
    for i in range(10):
        assert auth.authorize(f"Bearer t{i}", "/metrics").status == 503
    assert len(reviews.calls) == 1


def test_the_cache_is_bounded_by_evicting_the_oldest_decision() -> None:
    reviews, clock = Reviews({}, set()), FakeClock()
    auth = Authorizer(reviews, clock=clock, max_cached=3, per_source_burst=100)
    for i in range(4):
        auth.authorize(f"Bearer t{i}", "/metrics")
    auth.authorize("Bearer t3", "/metrics")  # still cached
    auth.authorize("Bearer t0", "/metrics")  # evicted: asked again
    assert reviews.calls.count("TokenReview") == 5
