"""A test-only crash hook: ``AGENTFN_CRASH_AT=<point>[:<tool>]`` kills the process there.

The reliability suite (tests/reliability) starts the app in a real process with this variable
set, so the SIGKILL lands at an exact step of the flow in docs/how-it-works/architecture.md
instead of at a random time.
It is armed only when a second, explicitly test-only switch is also set,
``AGENTFN_TEST_ONLY_ENABLE_CRASH_HOOK=yes-kill-this-process``, so a stray ``AGENTFN_CRASH_AT``
in a production environment can never kill a server. Unarmed (always, in production) it
costs one comparison per step.

Points: ``before_ack``, ``after_ack``, ``after_claim``, ``during_handler`` (called by a
handler itself), ``after_handler``, ``after_save``, ``after_submit``.
"""

from __future__ import annotations

import os
import signal

#: The second switch, and the value it must have: nothing sets this by accident.
ARMING_VARIABLE = "AGENTFN_TEST_ONLY_ENABLE_CRASH_HOOK"
ARMING_VALUE = "yes-kill-this-process"

_ARMED = os.environ.get(ARMING_VARIABLE) == ARMING_VALUE
_SPEC = os.environ.get("AGENTFN_CRASH_AT", "") if _ARMED else ""
_POINT, _, _TOOL = _SPEC.partition(":")


def crash_point(point: str, tool: str | None = None) -> None:
    """SIGKILL this process if ``AGENTFN_CRASH_AT`` names ``point`` (and ``tool``, if given)
    and the test-only switch arms the hook."""
    if _POINT and point == _POINT and (not _TOOL or tool == _TOOL):
        os.kill(os.getpid(), signal.SIGKILL)
