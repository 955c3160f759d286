"""Fixtures shared by the whole suite, and how its tests share the machine.

``make test`` runs the suite on two pytest-xdist workers (``pytest -n 2``). Two rules keep
them apart:

- Tests that use a shared service keep to names of their own: a random Redis key prefix,
  PostgreSQL schema or RabbitMQ queue (``tests/store/conftest.py``, ``tests/support/
  backends.py``), a port the OS picks (``tests/support/ports.py``), files under
  ``tmp_path``. Nothing flushes a whole Redis database or drops a schema it did not make.
- A test marked ``exclusive`` bounds a wall time (a latency, an event-loop gap, a rate over
  seconds, the soak under its nemesis): another worker's test competing for the two cores
  could break that bound, not the code. It runs while no other test runs: every test holds
  a lock file of the run shared, an exclusive one holds it alone (see
  :func:`pytest_runtest_protocol`). Without xdist nothing changes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

# The suite's own knobs (AGENTFN_FUZZ_EXAMPLES=5000 in `make fuzz`, the history tests'
# amounts) share the package's prefix: apps built from this environment would refuse them.
_KNOBS = "AGENTFN_FUZZ_EXAMPLES AGENTFN_HISTORY_*"
os.environ["AGENTFN_ALLOW_UNKNOWN"] = f"{os.environ.get('AGENTFN_ALLOW_UNKNOWN', '')} {_KNOBS}"


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio only: the package targets asyncio servers (uvicorn)."""
    return "asyncio"


@contextlib.contextmanager
def _turn(folder: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold the run's lock shared (or alone if ``exclusive``) while the body runs.

    A writer-preferring readers-writer lock of two ``flock`` files: each test passes the
    ``gate`` to take the ``lock``, and an exclusive test keeps the gate until it has the lock
    alone, so tests arriving meanwhile wait behind it instead of starving it.
    """
    with open(folder / "xdist.gate", "a") as gate, open(folder / "xdist.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Under xdist, run each test (setup, call and teardown) holding the run's lock: shared,
    or alone for a test marked ``exclusive``. The lock files live in the run's base temp
    folder, the parent of every worker's own (``--basetemp`` or pytest's numbered one)."""
    basetemp = item.config.option.basetemp
    if "PYTEST_XDIST_WORKER" not in os.environ or not basetemp:
        return (yield)
    exclusive = item.get_closest_marker("exclusive") is not None
    with _turn(Path(basetemp).parent, exclusive=exclusive):
        return (yield)
