"""The suite's one fake clock: time that moves only when a test (or a recorded sleep) says so."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A controllable clock: ``clock()`` reads :attr:`now`; :meth:`advance` moves it.

    Give it where the package takes ``clock=`` (Unix time) or ``monotonic=``; give
    :meth:`sleep` where it takes ``sleep=``: each pause is recorded in :attr:`sleeps` and
    moves the clock instead of waiting, so retry schedules are checked without waiting them.
    """

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        """Record the pause and let it pass at once."""
        self.sleeps.append(seconds)
        self.now += seconds
