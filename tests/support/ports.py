"""The suite's one free-port helper: the package's own (the demo binds its apps with it)."""

from __future__ import annotations

from agentfn_asgi.demo import free_port

__all__ = ["free_port"]
