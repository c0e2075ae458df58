"""A hypothesis sweep of AdmissionReview-shaped input against the real server over TLS:
every answer is a 200 review (allowed, or refused naming a field, never by a handler
crash), or a 400/413 saying what is wrong; never a 5xx, never a traceback. A few hundred
examples here; ``make fuzz`` runs the same categories at ≥ 10,000 requests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.review_strategies import CATEGORIES, KeptAlive, check_answer
from harness.webhook_world import World

EXAMPLES_PER_CATEGORY = 60


@pytest.fixture(scope="module")
def client(world: World) -> Iterator[KeptAlive]:
    sender = KeptAlive(world.target)
    yield sender
    sender.close()


@pytest.mark.parametrize("category", sorted(CATEGORIES))
def test_no_admission_review_shaped_input_gets_a_5xx_or_an_unnamed_refusal(
    client: KeptAlive, category: str
) -> None:
    path, bodies = CATEGORIES[category]

    @settings(
        max_examples=EXAMPLES_PER_CATEGORY,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=bodies)
    def sweep(data: bytes) -> None:
        status, answer = client.send(path, data)
        check_answer(status, answer, data)

    sweep()


def test_the_categories_cover_every_webhook() -> None:
    assert {path for path, _ in CATEGORIES.values()} == {
        "/validate-gpuclaim",
        "/mutate-vmi",
        "/mutate-launcher-pod",
    }
    assert isinstance(CATEGORIES["bytes"][1], st.SearchStrategy)
