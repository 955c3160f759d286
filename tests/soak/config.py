"""The soak's settings, from ``SOAK_*`` environment variables."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["STORES", "SoakConfig"]

STORES = ("sqlite", "redis", "postgres")


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """One soak run.

    ``seconds`` of load and faults, then up to ``drain_seconds`` for every call still
    waiting to be answered. ``rate``: new sessions per second (a few at most: the machine
    is shared). ``fault_interval``: the mean seconds between two faults. ``lease_seconds``
    is the replicas' lease (a pause lasts longer than it).
    """

    store: str = "redis"
    seconds: float = 600.0
    seed: int = 0
    rate: float = 1.0
    fault_interval: float = 4.0
    drain_seconds: float = 120.0
    lease_seconds: float = 3.0
    replicas: int = 3
    workdir: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SoakConfig:
        """``SOAK_STORE`` (postgres, redis or sqlite; default redis), ``SOAK_SECONDS``
        (default 600), ``SOAK_SEED`` (default: a random one, printed), ``SOAK_RATE``,
        ``SOAK_FAULT_INTERVAL``, ``SOAK_DRAIN_SECONDS``, ``SOAK_DIR`` (where logs and the
        ledger are kept; default a temporary folder)."""
        env = os.environ if env is None else env
        store = env.get("SOAK_STORE", "redis").strip().lower()
        if store not in STORES:
            raise ValueError(f"SOAK_STORE must be one of {', '.join(STORES)}, got {store!r}")
        seed_text = env.get("SOAK_SEED", "").strip()
        seed = int(seed_text) if seed_text else secrets.randbelow(1_000_000)
        workdir = env.get("SOAK_DIR", "").strip()
        config = cls(
            store=store,
            seconds=float(env.get("SOAK_SECONDS", "600")),
            seed=seed,
            rate=float(env.get("SOAK_RATE", "1")),
            fault_interval=float(env.get("SOAK_FAULT_INTERVAL", "4")),
            drain_seconds=float(env.get("SOAK_DRAIN_SECONDS", "120")),
            workdir=Path(workdir) if workdir else None,
        )
        if config.seconds <= 0 or not 0 < config.rate <= 5 or config.fault_interval <= 0:
            raise ValueError("need SOAK_SECONDS > 0, 0 < SOAK_RATE <= 5, SOAK_FAULT_INTERVAL > 0")
        return config
