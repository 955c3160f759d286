"""The soak itself, short (issue 27): one minute on Redis, so that it cannot rot.

Redis rather than SQLite: every fault kind runs on it, store connection cuts included
(SQLite has no connections to cut), and it is the store whose driver lost cancellations
(the first bug this soak found). ``make soak`` runs the long one on any store.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .config import SoakConfig
from .run import soak

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.backends, pytest.mark.exclusive]

#: The seed of the short run (SOAK_SEED overrides it); fixed, so a failure replays.
SEED = 27


async def test_a_one_minute_soak_on_redis_violates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three replicas on Redis for 60 s under the nemesis: nothing lost, no side effect
    twice, one result per call, no 5xx from a live replica, no traceback."""
    seed = int(os.environ.get("SOAK_SEED", SEED))
    config = SoakConfig(store="redis", seconds=60, seed=seed, drain_seconds=120, workdir=tmp_path)
    with capsys.disabled():
        report = await soak(config)
    assert report.ok, "\n".join(report.violations)
    assert sum(report.injected.values()) > 0
