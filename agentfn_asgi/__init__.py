"""agentfn-asgi: run function tools for OpenAI's Agents API from signed webhooks."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
