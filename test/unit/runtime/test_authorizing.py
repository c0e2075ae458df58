"""Scrape authorisation: 401 without or with a rejected token, 403 without RBAC, cached
decisions, fail closed when the API server cannot answer."""

from __future__ import annotations

from typing import Any

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
    return Authorizer(reviews, clock=clock or FakeClock())  # type: ignore[arg-type]


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


def test_when_the_api_server_cannot_answer_the_scrape_is_refused_and_not_cached() -> None:
    reviews = Reviews({"t": "prometheus"}, {"prometheus"}, down=True)
    auth = authorizer(reviews)
    assert auth.authorize("Bearer t", "/metrics").status == 403
    reviews.down = False
    assert auth.authorize("Bearer t", "/metrics").status == 200
