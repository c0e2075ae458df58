"""The chaos load generator's retries (``chaos.load.retrying``): an answer that is the API
server or a webhook not answering yet is retried; a decision is raised at once."""

from __future__ import annotations

from collections.abc import Callable

import pykube
import pytest
import requests
from chaos import load


def _requests_error(status: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"{status} Server Error", response=response)


def _failing(errors: list[Exception]) -> Callable[[], str]:
    """A call that raises each of ``errors`` in turn, then answers."""
    pending = list(errors)

    def call() -> str:
        if pending:
            raise pending.pop(0)
        return "answered"

    return call


@pytest.fixture(autouse=True)
def _no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load, "RETRY_PAUSE", 0.0)


def test_a_restarted_api_server_answering_503_to_a_list_is_retried() -> None:
    # pykube's list (Query.execute) raises requests' own HTTPError, not pykube's.
    tally = load.Tally()
    call = _failing([_requests_error(503), _requests_error(503)])
    assert load.retrying(tally, "listing", call) == "answered"
    assert (tally.retries, tally.not_ready) == (2, 0)


def test_a_webhook_catching_up_is_retried_and_counted() -> None:
    tally = load.Tally()
    not_ready = pykube.exceptions.HTTPError(
        503,
        'admission webhook "orders.gpu.cozystack.io" denied the request: gpuoperator is '
        "starting and its caches are not synced yet; retry shortly",
    )
    assert load.retrying(tally, "ordering", _failing([not_ready])) == "answered"
    assert (tally.retries, tally.not_ready) == (1, 1)


@pytest.mark.parametrize(
    "error",
    [
        _requests_error(403),
        pykube.exceptions.HTTPError(403, 'admission webhook "x" denied the request: budget'),
        pykube.exceptions.HTTPError(500, 'admission webhook "x" denied the request: a bug'),
    ],
    ids=["forbidden-list", "webhook-refusal", "webhook-internal-error"],
)
def test_a_decision_is_raised_at_once(error: Exception) -> None:
    tally = load.Tally()
    with pytest.raises(type(error)):
        load.retrying(tally, "ordering", _failing([error]))
    assert tally.retries == 0
