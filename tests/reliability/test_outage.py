"""The outage helpers the crash matrix uses hold the store and then let it go."""

from __future__ import annotations

import anyio
import pytest

from ..store.conftest import require_service
from .outage import StallingProxy

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.backends]


async def test_stalling_proxy_holds_every_byte_then_forwards_them() -> None:
    """Through the proxy Redis answers; stalled, a command gets no answer (and a new
    connection none either); afterwards the held command's answer arrives."""
    redis = pytest.importorskip("redis.asyncio")
    async with StallingProxy("127.0.0.1", 6379) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=30)
        fresh = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=30)
        try:
            try:
                assert await client.ping()
            except (OSError, redis.ConnectionError) as exc:
                require_service("redis", str(exc))
            answers: list[bool] = []
            async with anyio.create_task_group() as group, proxy.stalled():
                group.start_soon(lambda: _ping_into(client, answers))
                group.start_soon(lambda: _ping_into(fresh, answers))
                await anyio.sleep(0.3)
                assert answers == []  # nothing crossed while stalled
            assert answers == [True, True]
        finally:
            await client.aclose()
            await fresh.aclose()


async def _ping_into(client: object, answers: list[bool]) -> None:
    answers.append(await client.ping())  # type: ignore[attr-defined]
