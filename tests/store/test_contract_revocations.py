"""The store contract, revocations: a short store-wide list of revoked credentials (the
operator page's logouts), shared by replicas, kept across restarts, forgotten after the time
the credential would have expired anyway; on every backend."""

from __future__ import annotations

import pytest

from .conftest import FakeClock, StoreFactory

pytestmark = pytest.mark.anyio

HOUR = 3600.0


async def test_a_revocation_holds_for_every_replica_and_namespace_until_it_expires(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    """Revoked through one instance: revoked for another instance (a replica), another
    namespace and an instance opened after the first closed (a restart); other ids are
    not; revoking again is harmless; the entry ends at ``expires_at``."""
    first = await store_factory()
    assert not await first.token_revoked("sid-1")
    await first.revoke_token("sid-1", expires_at=clock.now + 8 * HOUR)
    await first.revoke_token("sid-1", expires_at=clock.now + 8 * HOUR)
    replica = await store_factory()
    other_project = await store_factory(namespace="proj_b")
    assert await replica.token_revoked("sid-1")
    assert await other_project.token_revoked("sid-1")
    assert not await replica.token_revoked("sid-2")
    await first.close()
    restarted = await store_factory()
    assert await restarted.token_revoked("sid-1")
    clock.advance(8 * HOUR - 1)
    assert await restarted.token_revoked("sid-1")
    clock.advance(1)
    assert not await restarted.token_revoked("sid-1")


async def test_a_revocation_already_expired_is_not_kept(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    """Revoking a credential past its expiry records nothing (it is refused anyway), and a
    later revocation drops expired entries (the list stays as short as the live ones)."""
    store = await store_factory()
    await store.revoke_token("old", expires_at=clock.now - 1)
    assert not await store.token_revoked("old")
    await store.revoke_token("short", expires_at=clock.now + 10)
    clock.advance(20)
    await store.revoke_token("new", expires_at=clock.now + HOUR)
    assert not await store.token_revoked("short")
    assert await store.token_revoked("new")
