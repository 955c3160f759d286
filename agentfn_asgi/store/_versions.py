"""Schema versions of the durable stores: the rule that lets two releases share a store.

A store's data carries two numbers: its *version*, how many steps of the schema it was
given, and *readable_from*, the oldest version whose code still works on it. The schema is
an ordered list of :class:`Step` (step ``n`` brings version ``n - 1`` to ``n``). A step
that only adds (a column, an index, a table, a key the older code never reads) keeps
``readable_from``: replicas of the release before keep working beside the one that took
the step, which is what a rolling deploy needs (expand). A step that removes or changes
what older code relies on raises it, and ships a release after the expand step that made
it safe (contract). Code refuses data it cannot read (:func:`check_readable`) and takes
the steps it knows that the data lacks (:func:`steps_to_take`; :func:`readable_after` says
what the data is then readable from). The first step makes new data in the newest shape, so
new data takes it alone: a later release that adds a column or an index adds it to what the
first step makes, and appends a step that adds it to data made before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentfn_asgi.errors import StoreError

__all__ = ["Step", "check_readable", "readable_after", "steps_to_take"]


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a store's schema: what it runs (SQL statements, or Lua scripts), and
    the oldest version whose code still works on the data after it."""

    change: tuple[str, ...]
    readable_from: int


def check_readable(where: str, *, version: int, readable_from: int, steps: int) -> None:
    """Refuse data of ``version`` that code knowing ``steps`` steps cannot work on."""
    if readable_from > steps:
        raise StoreError(
            f"{where} has schema version {version}, readable from version {readable_from} "
            f"on; this agentfn-asgi knows schema version {steps}: upgrade the package"
        )


def readable_after(steps: Sequence[Step], version: int, readable_from: int) -> int:
    """``readable_from`` of data at ``version`` once it took the rest of ``steps``."""
    return max([readable_from, *(step.readable_from for step in steps[version:])])


def steps_to_take(steps: Sequence[Step], version: int) -> Sequence[Step]:
    """The steps data at ``version`` lacks: new data (version 0) takes the first alone."""
    return steps[:1] if version == 0 else steps[version:]
