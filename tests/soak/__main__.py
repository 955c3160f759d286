"""``python -m tests.soak`` (``make soak``): one soak run configured by ``SOAK_*`` variables
(see :class:`tests.soak.config.SoakConfig`); exit 0 when nothing was violated, 1 otherwise,
2 when it could not run (a bad setting, a store service that does not answer)."""

from __future__ import annotations

import asyncio
import sys

from .config import SoakConfig
from .run import soak


def main() -> int:
    """Run one soak from the environment's settings."""
    try:
        config = SoakConfig.from_env()
    except ValueError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(soak(config))
    except BaseException as exc:
        # tests.support.backends skips (a pytest outcome) when the store service is missing.
        if type(exc).__name__ in ("Skipped", "Failed"):
            print(f"soak: cannot run: {exc}", file=sys.stderr)
            return 2
        raise
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
