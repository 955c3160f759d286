"""The soak's approver: stopping a command that has just ended is no error."""

from __future__ import annotations

import asyncio
import sys

import pytest

from .approver import _stop

pytestmark = pytest.mark.anyio


async def test_stopping_a_command_that_already_ended_raises_nothing() -> None:
    # The soak cancels the approver at the end; a listing that has just finished must not
    # end the run with ProcessLookupError (it did once, on PostgreSQL).
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "pass", stdout=asyncio.subprocess.PIPE
    )
    await process.communicate()
    # Let the loop close the ended process's transport: kill() then raises ProcessLookupError.
    await asyncio.sleep(0.2)
    await _stop(process)
    assert process.returncode == 0
