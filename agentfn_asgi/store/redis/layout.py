"""The key layout of the Redis store: its version marker and the steps that bring a key
prefix to it (the rule two releases share a store by is in
:mod:`agentfn_asgi.store._versions`).

``{p}layout`` is a hash ``{version, readable_from}``, the one key outside the namespaces.
Layout 1 is the keys drawn in :mod:`agentfn_asgi.store.redis.store`; they are made as records are
written, so a new prefix needs nothing but its marker. A later release appends a step to
:data:`STEPS`: Lua that runs once, at open, in the same script that moves the marker on
(``P``: the bare key prefix). It is additive first (keys the release before never reads, a
new index say, while that release's replicas keep writing records without it: the new code
copes with them), so replicas of both run side by side during a rolling deploy; what the
new layout no longer needs is removed a release later, by a step that raises
``readable_from``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from agentfn_asgi.store._versions import Step, check_readable, readable_after, steps_to_take

__all__ = ["LAYOUT_KEY", "STEPS", "layout_change"]

#: The marker's key, after the prefix.
LAYOUT_KEY: Final = "layout"

#: Layout 1 makes nothing at open: every key appears with the record it belongs to. Layout 2
#: (0.2) adds no key at open (a call budget's set appears with the calls it counts; a state's
#: index with its first call), but its calls may be ``cancelled``, ``unanswered`` or
#: ``retired``, states 0.1.0 cannot read: it is readable from 2 only, and a 0.1.0 replica
#: refuses it at start instead of failing on such a call.
STEPS: Final = (Step(("",), readable_from=2), Step(("",), readable_from=2))

# ARGV: P, the version the steps start from, the version and readable_from they give. The
# marker is compared first, so of replicas opening at once only one takes the steps; the
# others answer 0 and read the marker again.
_CHANGE = """
local P = ARGV[1]
local marker = P .. '{marker}'
if (redis.call('HGET', marker, 'version') or '0') ~= ARGV[2] then return 0 end
{steps}
redis.call('HSET', marker, 'version', ARGV[3], 'readable_from', ARGV[4])
return 1
"""


def layout_change(found: Sequence[str | None], where: str) -> tuple[str, list[str]] | None:
    """The script and its arguments after ``P`` that bring a prefix whose marker holds
    ``found`` (its version and readable_from, None where absent: a new prefix) to the last
    of :data:`STEPS`; None when it is there or ahead. Raises
    :class:`~agentfn_asgi.errors.StoreError` when the prefix is of a version this code
    cannot work on."""
    steps = STEPS
    version, readable_from = (int(value or 0) for value in found)
    check_readable(where, version=version, readable_from=readable_from, steps=len(steps))
    if version >= len(steps):
        return None
    taken = steps_to_take(steps, version)
    body = "\n".join(f"do\n{change}\nend" for step in taken for change in step.change)
    readable = readable_after(steps, version, readable_from)
    return _CHANGE.format(marker=LAYOUT_KEY, steps=body), [
        str(version),
        str(len(steps)),
        str(readable),
    ]
