"""The test-only crash hook is armed only by its own, explicitly test-only switch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from agentfn_asgi._crash import ARMING_VALUE, ARMING_VARIABLE

# Every test starts a Python process: not for ``make check``.
pytestmark = pytest.mark.slow

_PROBE = "from agentfn_asgi._crash import crash_point; crash_point('after_save', 'refund')"


def _run(env: dict[str, str]) -> int:
    clean = {k: v for k, v in os.environ.items() if k not in ("AGENTFN_CRASH_AT", ARMING_VARIABLE)}
    done = subprocess.run([sys.executable, "-c", _PROBE], env={**clean, **env}, timeout=60)
    return done.returncode


@pytest.mark.parametrize(
    ("env", "dies"),
    [
        ({"AGENTFN_CRASH_AT": "after_save"}, False),
        ({"AGENTFN_CRASH_AT": "after_save", ARMING_VARIABLE: "1"}, False),
        ({"AGENTFN_CRASH_AT": "after_save", ARMING_VARIABLE: ARMING_VALUE}, True),
        ({"AGENTFN_CRASH_AT": "after_save:refund", ARMING_VARIABLE: ARMING_VALUE}, True),
        ({"AGENTFN_CRASH_AT": "after_save:other", ARMING_VARIABLE: ARMING_VALUE}, False),
    ],
)
def test_the_hook_kills_only_when_armed(env: dict[str, str], dies: bool) -> None:
    """A stray AGENTFN_CRASH_AT alone never kills a process (it did before the second
    switch existed); armed, it SIGKILLs at the named point (and tool)."""
    code = _run(env)
    assert code == (-signal.SIGKILL if dies else 0)
