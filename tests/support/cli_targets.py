"""Things a user points ``agentfn-asgi tools MODULE:ATTR`` at by mistake (tests/mistakes.py)."""

from __future__ import annotations

from starlette.applications import Starlette

from agentfn_asgi import FunctionTools

tools = FunctionTools()


@tools.function
def lookup(city: str) -> str:
    """Look a city up."""
    return city


#: The host application, not the registry.
app = Starlette()

#: A setting that happens to live next to the registry.
retries = 3
