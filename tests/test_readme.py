"""The README's promises: the two set-up commands first, and a quick start that runs as
written (a stale README is a bug). The documentation's code is checked by test_docs.py."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.docs import README, block
from tests.support.ports import free_port

SESSION_TIMEOUT = 90.0  # generous: the machine may be loaded; polled, not a timed assertion


def test_the_readme_starts_with_the_two_commands() -> None:
    """The first block is exactly `make demo` then `make test` (what DEVELOPERS.md promises)."""
    text = README.read_text(encoding="utf-8")
    found = re.search(r"```bash\n(.*?)```", text, re.DOTALL)
    assert found is not None
    commands = [line.split("#")[0].strip() for line in found.group(1).splitlines()]
    assert commands == ["make demo", "make test"]


def test_the_readme_stays_short() -> None:
    """The README is an entrance (what, for whom, install, quick start, guarantees, links);
    everything else lives in docs/."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 260


@contextlib.contextmanager
def _shell(script: str, cwd: Path, env: dict[str, str], log: Path) -> Iterator[None]:
    """Run ``script`` with bash in its own process group; stop the group on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    """The quick start, as the README writes it: `tools.py` and `app.py` in a fresh folder,
    the environment block, `uvicorn app:app` in one shell and `agentfn-asgi fake-api ...` in
    another. The fake's session is answered: its submission is the tool's result, and the
    app printed the start-up and `call finished` lines the README shows. Only the two ports
    are replaced by free ones (the suite runs beside other processes)."""
    (tmp_path / "tools.py").write_text(block("quickstart-tools"), encoding="utf-8")
    (tmp_path / "app.py").write_text(block("quickstart-app"), encoding="utf-8")
    api_port, app_port = free_port(), free_port()

    def ports(script: str) -> str:
        return script.replace("8765", str(api_port)).replace("8000", str(app_port))

    environment = ports(block("quickstart-env"))
    # What the README's reader has: the package's commands on PATH, nothing of ours set.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTFN_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    app_log, fake_log = tmp_path / "uvicorn.log", tmp_path / "fake.log"
    with (
        _shell(environment + ports(block("quickstart-uvicorn")), tmp_path, env, app_log),
        _shell(environment + ports(block("quickstart-fake")), tmp_path, env, fake_log),
    ):
        submissions: list[dict[str, object]] = []
        deadline = time.monotonic() + SESSION_TIMEOUT

        def answered() -> bool:
            # The fake records the result, then both sides print it: wait for all three.
            return bool(
                submissions
                and "call finished" in app_log.read_text()
                and "result  sess_" in fake_log.read_text()
            )

        while not answered() and time.monotonic() < deadline:
            time.sleep(0.3)
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.get(f"http://127.0.0.1:{api_port}/_fake/submissions", timeout=5)
                submissions = answer.json()
        logs = f"--- uvicorn\n{app_log.read_text()}\n--- fake-api\n{fake_log.read_text()}"
        assert answered(), logs
    [submission] = submissions
    assert submission["success"] is True, logs
    assert submission["output"] == "Sunny and 21 °C in Paris", logs
    app_lines = app_log.read_text()
    assert "INFO agentfn_asgi.app: agentfn-asgi started: 1 tool, store sqlite:///" in app_lines
    assert "call finished: tool=get_weather" in app_lines and "outcome=success" in app_lines
    assert shlex.split(block("quickstart-uvicorn"))[0] == "uvicorn"  # the command shown
