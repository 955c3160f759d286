"""Run ``tests.reliability.crash_app`` under uvicorn in a child process, kill it, restart it.

The child is a real deployment in miniature: its own interpreter, the SQLite store on disk,
the Agents API (a :class:`~agentfn_asgi.testing.FakeAgentsAPI` served by the test process)
reached over loopback. ``AGENTFN_CRASH_AT`` makes it SIGKILL itself at one step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx

from agentfn_asgi._crash import ARMING_VALUE, ARMING_VARIABLE

from ..support.ports import free_port
from .crash_app import LEDGER_ENV

__all__ = ["ROOT", "AppProcess"]

#: The repository root: the child runs there so ``tests.reliability.crash_app`` imports.
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class AppProcess:
    """One app deployment: a port, a store file, a ledger, and the child serving them.

    ``start`` may be called again after the child died: the new child gets the same port,
    store and ledger, as a restarted service would.
    """

    api_base: str
    secret: str
    api_key: str
    workdir: Path
    module: str = "tests.reliability.crash_app:app"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        """Where webhooks go (the sub-app is served at the root)."""
        return f"http://127.0.0.1:{self.port}/"

    @property
    def store_url(self) -> str:
        return f"sqlite:///{self.workdir / 'store.sqlite3'}"

    @property
    def ledger(self) -> Path:
        return self.workdir / "ledger.jsonl"

    def log_text(self) -> str:
        """Everything every child wrote to stdout and stderr so far."""
        return "".join(
            path.read_text(errors="replace") for path in sorted(self.workdir.glob("child-*.log"))
        )

    async def start(self, *, crash_at: str | None = None, timeout: float = 15.0) -> None:  # noqa: ASYNC109
        """Start a child and wait until it answers ``/healthz`` (start-up recovery has begun)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTFN_", "OPENAI_"))}
        env.update(
            OPENAI_API_KEY=self.api_key,
            OPENAI_BASE_URL=self.api_base,
            OPENAI_WEBHOOK_SECRET=self.secret,
            AGENTFN_STORE_URL=self.store_url,
            PYTHONUNBUFFERED="1",
        )
        env[LEDGER_ENV] = str(self.ledger)
        env["AGENTFN_ALLOW_UNKNOWN"] = LEDGER_ENV  # the test app's own variable
        if crash_at is not None:
            env["AGENTFN_CRASH_AT"] = crash_at
            env[ARMING_VARIABLE] = ARMING_VALUE
        self.starts += 1
        log = (self.workdir / f"child-{self.starts}.log").open("wb")
        with log:
            # Popen only forks and execs; the wait for readiness below is asynchronous.
            self.proc = subprocess.Popen(  # noqa: ASYNC220
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    self.module,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--lifespan",
                    "on",
                    "--log-level",
                    "warning",
                    "--no-access-log",
                    "--timeout-graceful-shutdown",
                    "1",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        await self._wait_ready(timeout)

    async def _wait_ready(self, timeout: float) -> None:  # noqa: ASYNC109
        assert self.proc is not None
        async with httpx.AsyncClient(timeout=1.0) as http:
            with anyio.fail_after(timeout):
                while True:
                    if self.proc.poll() is not None:
                        raise RuntimeError(f"app exited during start-up:\n{self.log_text()}")
                    with contextlib.suppress(httpx.TransportError):
                        answer = await http.get(f"http://127.0.0.1:{self.port}/healthz")
                        if answer.status_code == 200:
                            return
                    await anyio.sleep(0.02)

    async def wait_exit(self, timeout: float = 10.0) -> int:  # noqa: ASYNC109
        """Wait for the child to end on its own; its return code (-9: SIGKILL)."""
        assert self.proc is not None
        with anyio.fail_after(timeout):
            while (code := self.proc.poll()) is None:
                await anyio.sleep(0.01)
        return code

    async def stop(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """SIGTERM (graceful: drain, close the store), SIGKILL if it does not end in time."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            await anyio.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL the child now, if it runs (test clean-up)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
