"""``python -m agentfn_asgi``: the same command line as ``agentfn-asgi``."""

from __future__ import annotations

from agentfn_asgi.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
