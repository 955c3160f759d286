"""Fixtures shared by the whole suite."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio only: the package targets asyncio servers (uvicorn)."""
    return "asyncio"
