"""Run an app under uvicorn in a child process and wait until it is healthy.

:func:`run_example` is what the demo starts its app with, and what the examples' end-to-end
tests use: ``uvicorn TARGET`` (``module:attr``) on a free loopback port, stopped on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import site
import socket
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from agentfn_asgi.errors import ConfigurationError, DemoError

__all__ = [
    "WEBHOOK_PATH",
    "RunningExample",
    "find_project_root",
    "free_port",
    "run_example",
]

WEBHOOK_PATH = "/openai/webhooks"


# -- running an example app ------------------------------------------------------------------


#: The ports :func:`free_port` has handed out in this process.
_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it), and not one this process was
    handed before: two ports picked before either is bound (two replicas, an app and its
    API) are never the same, which the OS alone does not promise once the first is closed."""
    for _ in range(100):
        port = _probe(host)
        if port not in _HANDED_OUT:
            break
    _HANDED_OUT.add(port)
    return port


def _probe(host: str) -> int:
    """The port the OS gives a socket bound to port 0 (closed again at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


#: The folder this package was imported from (site-packages, or a source checkout).
_PACKAGE_PARENT = Path(__file__).resolve().parents[2]


def find_project_root() -> Path:
    """The source checkout holding ``examples/`` (next to the package, else the cwd)."""
    for candidate in (_PACKAGE_PARENT, Path.cwd()):
        if (candidate / "examples" / "starlette_app.py").is_file():
            return candidate
    raise ConfigurationError(
        "the examples (examples.*) run from a source checkout: run this from the repository root"
    )


def _package_path() -> list[str]:
    """Where a child must look for this package: nothing extra once it is installed."""
    installed = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    return [] if _PACKAGE_PARENT in installed else [str(_PACKAGE_PARENT)]


@dataclass(frozen=True, slots=True)
class RunningExample:
    """An example app running under uvicorn in a child process."""

    url: str
    """Root URL, ``http://127.0.0.1:PORT``."""
    port: int
    process: asyncio.subprocess.Process
    log_path: Path

    @property
    def webhook_url(self) -> str:
        """Where its webhook receiver answers."""
        return self.url + WEBHOOK_PATH

    def log(self) -> str:
        """Everything the child wrote to stdout and stderr so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""


@contextlib.asynccontextmanager
async def run_example(
    target: str,
    *,
    env: Mapping[str, str],
    log_path: Path,
    cwd: Path | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    startup_timeout: float = 20.0,
    options: Sequence[str] = (),
) -> AsyncIterator[RunningExample]:
    """Run ``uvicorn TARGET`` (``module:attr``) in a child process until the block exits.

    ``env`` is added to this process's environment; the child runs in ``cwd`` (default: the
    source checkout, for ``examples.*``), from where ``TARGET`` is importable, and finds
    this package where this process found it. ``options`` are more uvicorn options, after
    (so over) this function's own: ``("--workers", "4")`` makes the child uvicorn's
    supervisor of four worker processes on the one port. Yields once
    ``GET /openai/webhooks/healthz`` answers 200; raises :class:`DemoError` with the
    child's output if it exits or stays unhealthy for ``startup_timeout`` seconds. The child
    is always stopped on exit (SIGTERM, then SIGKILL after 5 s).
    """
    port = port or free_port(host)
    root = cwd or find_project_root()
    child_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(root), *_package_path(), os.environ.get("PYTHONPATH", "")) if p
    )
    command = [sys.executable, "-m", "uvicorn", target, "--host", host, "--port", str(port)]
    command += ["--log-level", "warning", "--lifespan", "on", "--timeout-graceful-shutdown", "5"]
    command += options
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            *command, cwd=root, env=child_env, stdout=log_file, stderr=asyncio.subprocess.STDOUT
        )
    running = RunningExample(f"http://{host}:{port}", port, process, log_path)
    try:
        await _wait_healthy(running, startup_timeout)
        yield running
    finally:
        await _stop(process)


async def _wait_healthy(running: RunningExample, limit: float) -> None:
    deadline = time.monotonic() + limit
    last = "no answer"
    async with httpx.AsyncClient(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if running.process.returncode is not None:
                raise DemoError(
                    f"the example exited with code {running.process.returncode} during "
                    f"start-up:\n{running.log()}"
                )
            try:
                response = await http.get(running.webhook_url + "/healthz")
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            else:
                if response.status_code == 200:
                    return
                last = f"{response.status_code} {response.text}"
            await asyncio.sleep(0.05)
    raise DemoError(f"the example was not healthy after {limit:.0f} s ({last}):\n{running.log()}")


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        await asyncio.wait_for(process.wait(), timeout=5.0)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


# -- the scripted session --------------------------------------------------------------------
