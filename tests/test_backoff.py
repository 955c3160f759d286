"""The one backoff (agentfn_asgi/backoff.py): its formula, its cap, its jitter range (only
ever shorter), and the switch that makes every user of it instant."""

from __future__ import annotations

import httpx
import pytest

from agentfn_asgi import AgentsClient, DispatchSettings, RetryPolicy
from agentfn_asgi.backoff import Backoff, instant
from agentfn_asgi.errors import ConfigurationError
from agentfn_asgi.stream import RECONNECT
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall

from .support.clock import FakeClock


def test_the_wait_grows_by_the_factor_from_the_base_up_to_the_cap() -> None:
    """base * factor ** (failures - 1), never above the cap; no jitter: exactly that."""
    doubling = Backoff(base=0.25, cap=8.0)
    assert [doubling.delay(n) for n in range(1, 9)] == [0.25, 0.5, 1, 2, 4, 8, 8, 8]
    tripling = Backoff(base=1.0, cap=100.0, factor=3.0)
    assert [tripling.delay(n) for n in range(1, 6)] == [1, 3, 9, 27, 81]
    assert doubling.delay(0) == 0.25  # "no failure yet" waits as the first


def test_jitter_only_shortens_the_wait_by_up_to_its_fraction() -> None:
    """A draw of 0 keeps the wait, a draw near 1 takes the whole fraction off; fresh draws
    land in [(1 - jitter) * wait, wait], so the cap is never passed."""
    backoff = Backoff(base=1.0, cap=4.0, jitter=0.25)
    assert backoff.delay(2, random=0.0) == 2.0
    assert backoff.delay(2, random=0.5) == 1.75
    assert backoff.delay(9, random=0.999) == pytest.approx(3.0, abs=0.01)
    draws = [backoff.delay(9) for _ in range(2000)]
    assert all(3.0 <= d <= 4.0 for d in draws)
    assert max(draws) - min(draws) > 0.5  # they do spread
    assert all(0.375 <= RECONNECT.delay(1) <= 0.5 for _ in range(100))


def test_a_record_failing_for_weeks_waits_the_cap_instead_of_overflowing() -> None:
    """2.0 ** 1100 overflows a float: the sweep's delay for a record that failed that often
    is the cap, not an OverflowError out of the sweep."""
    assert DispatchSettings(retry_base=1.0, retry_cap=1.0).retry_delay(5000) == 1.0
    assert Backoff(base=1.0, cap=60.0, factor=10.0).delay(400) == 60.0


@pytest.mark.parametrize(
    "options",
    [{"base": 0.0}, {"cap": -1.0}, {"factor": 0.5}, {"jitter": 1.5}, {"jitter": -0.1}],
)
def test_a_backoff_that_cannot_work_is_refused(options: dict[str, float]) -> None:
    settings = {"base": 1.0, "cap": 10.0, **options}
    with pytest.raises(ConfigurationError, match="factor >= 1"):
        Backoff(**settings)


def test_instant_makes_every_backoff_wait_nothing_until_the_block_ends() -> None:
    """The one switch reaches the backoff itself, a retry policy and the sweep's delay, and
    nests: the outer block is still instant after an inner one ends."""
    backoff = Backoff(base=1.0, cap=8.0, jitter=0.25)
    policy = RetryPolicy(initial_backoff=2.0)
    settings = DispatchSettings()
    with instant():
        with instant():
            assert backoff.delay(3) == 0.0
        assert (policy.backoff(2), settings.retry_delay(4), RECONNECT.delay(2)) == (0, 0, 0)
    assert backoff.delay(3, random=0.0) == 4.0
    assert (policy.backoff(2), settings.retry_delay(4)) == (4.0, 40.0)


@pytest.mark.anyio
async def test_instant_keeps_the_client_retry_count_and_a_servers_retry_after() -> None:
    """Under the switch the client retries as often as before without pausing, except where
    the server asked for a pause (Retry-After is not a backoff)."""
    clock = FakeClock()
    async with FakeAgentsAPI() as fake:
        sid = fake.create_session([[FakeCall("lookup", {"id": 1})]])
        fake.fail_next("retrieve", 3, 503)
        fake.fail_next("retrieve", 1, 429, retry_after=3)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fake)) as http:
            client = AgentsClient(
                api_key="sk-test",
                base_url="http://fake/v1",
                http_client=http,
                sleep=clock.sleep,
                monotonic=clock,
            )
            with instant():
                await client.retrieve_session(sid)
    assert clock.sleeps == [0.0, 0.0, 0.0, 3.0]
    assert len([r for r in fake.requests if r.route == "retrieve"]) == 5
