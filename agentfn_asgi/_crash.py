"""A test-only crash hook: ``AGENTFN_CRASH_AT=<point>[:<tool>]`` kills the process there.

The reliability suite (tests/reliability) starts the app in a real process with this variable
set, so the SIGKILL lands at an exact step of DESIGN.md's flow instead of at a random time.
Unset (always, in production) it costs one comparison per step.

Points: ``before_ack``, ``after_ack``, ``after_claim``, ``during_handler`` (called by a
handler itself), ``after_handler``, ``after_save``, ``after_submit``.
"""

from __future__ import annotations

import os
import signal

_SPEC = os.environ.get("AGENTFN_CRASH_AT", "")
_POINT, _, _TOOL = _SPEC.partition(":")


def crash_point(point: str, tool: str | None = None) -> None:
    """SIGKILL this process if ``AGENTFN_CRASH_AT`` names ``point`` (and ``tool``, if given)."""
    if _POINT and point == _POINT and (not _TOOL or tool == _TOOL):
        os.kill(os.getpid(), signal.SIGKILL)
