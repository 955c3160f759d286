"""The one exponential backoff: every pause before trying again is a :class:`Backoff`.

The client's retries, the sweep of failing records, stream mode's reconnects, a worker's
completions, a tool's :class:`~agentfn_asgi.RetryPolicy` and approval notifications all wait
``min(base * factor ** (failures - 1), cap)`` after their ``failures``-th failure in a row.
**Jitter only shortens that wait**: a random part of up to ``jitter`` (a fraction) is taken
off, so a cap is a true bound and replicas failing together spread out below it (the official
OpenAI client's convention: a factor in [0.75, 1.0], ``jitter=0.25``). Within :func:`instant`
every backoff waits 0 s (tests); retry counts, deadlines and a server's ``Retry-After`` stay.
"""

from __future__ import annotations

import contextlib
import random as _random
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import ConfigurationError

__all__ = ["Backoff", "instant"]

_instant = False


@dataclass(frozen=True, slots=True)
class Backoff:
    """Wait ``base`` seconds after the first failure, ``factor`` times longer after each
    further one, at most ``cap``, less a random part of up to ``jitter`` of it."""

    base: float
    cap: float
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.cap > 0 and self.factor >= 1 and 0 <= self.jitter <= 1):
            raise ConfigurationError(f"{self!r}: need base, cap > 0, factor >= 1, jitter in [0, 1]")

    def delay(self, failures: int, random: float | None = None) -> float:
        """Seconds to wait after the ``failures``-th failure in a row (1 for the first);
        ``random`` in [0, 1) picks the jitter (default: a fresh draw)."""
        if _instant:
            return 0.0
        try:
            wait = min(self.base * self.factor ** max(failures - 1, 0), self.cap)
        except OverflowError:  # a record failing for weeks waits the cap, not a crash
            wait = self.cap
        return wait * (1.0 - self.jitter * (_random.random() if random is None else random))


@contextlib.contextmanager
def instant() -> Iterator[None]:
    """Within this block every :class:`Backoff` of the process waits 0 s (tests)."""
    global _instant
    before, _instant = _instant, True
    try:
        yield
    finally:
        _instant = before
