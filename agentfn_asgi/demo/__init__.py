"""The embedded demo (``agentfn-asgi demo``, ``make demo``), shipped with the package.

- :mod:`~agentfn_asgi.demo.tools`: three tools (a lookup, a refund with a reconcile hook,
  a slow echo), which the examples serve too;
- :mod:`~agentfn_asgi.demo.app`: a Starlette app serving them, configured from the
  environment (imported only by the uvicorn child that runs it);
- :mod:`~agentfn_asgi.demo.play`: :func:`run_demo`, the scripted session and its timeline;
- :mod:`~agentfn_asgi.demo.process`: :func:`run_example`, an app under uvicorn in a child
  process (also what the examples' end-to-end tests use).

Needs uvicorn: ``pip install 'agentfn-asgi[server]'``.
"""

from __future__ import annotations

from agentfn_asgi.demo.play import DEMO_STEPS, run_demo
from agentfn_asgi.demo.process import RunningExample, find_project_root, free_port, run_example

__all__ = [
    "DEMO_STEPS",
    "RunningExample",
    "find_project_root",
    "free_port",
    "run_demo",
    "run_example",
]
