"""The embedded demo (``make demo``, ``agentfn-asgi demo``): it plays the scripted session
against the demo's app, prints the timeline and summary, exits 0 on success and 1 with a
clear message on failure, and leaves no process or temporary folder behind."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from agentfn_asgi.demo import find_project_root, run_demo
from agentfn_asgi.demo.tools import tools

ROOT = Path(__file__).resolve().parents[2]


def _workdir(output: str) -> Path:
    match = re.search(r"store sqlite:///(\S+)/agentfn\.sqlite3", output)
    assert match, output
    return Path(match.group(1))


@pytest.mark.slow
@pytest.mark.anyio
async def test_demo_plays_the_session_and_cleans_up() -> None:
    """Every stage of the timeline is printed, the summary names each call, and afterwards
    no child process runs and the temporary folder is gone."""
    children = set(psutil.Process().children(recursive=True))  # other tests' may be exiting
    out = io.StringIO()
    code = await run_demo(out=out)
    output = out.getvalue()
    assert code == 0, output
    for stage in (
        "delivery verified and recorded",
        "read       GET /v1/agents/sessions/",
        "handler    get_customer",
        "saved      create_refund   call_bad_refund  failed (tool_error)",
        "claimed    lookup_invoice  call_unknown     no handler registered",
        "submitted  slow_echo",
        "step 2 asks for 1 call(s)",
        "step 3 asks for 1 call(s)",
        "approval   close_account   call_close       waits for a person (apr_",
        "approval   close_account   call_close       approved by the demo; the app runs it",
        "submitted  close_account   call_close       success",
        "turn completed, session idle",
        "summary",
        "slow_echo x2 ran in parallel",
        "ledger: 1 refund line(s) written",
        "ledger: 1 account closure line(s) written, after approval",
        "demo passed",
    ):
        assert stage in output, stage
    assert set(psutil.Process().children(recursive=True)) <= children
    assert not _workdir(output).exists()


@pytest.mark.slow
@pytest.mark.anyio
async def test_demo_failure_is_clear_and_cleans_up() -> None:
    """A demo that cannot finish in time exits 1 with the reason and the app's own log
    (without ``--verbose``: it is what tells a stuck call from a refused one), and still
    stops the example and removes its folder."""
    children = set(psutil.Process().children(recursive=True))  # other tests' may be exiting
    out = io.StringIO()
    code = await run_demo(time_limit=0.0, out=out)
    output = out.getvalue()
    assert code == 1
    assert "demo FAILED: the session was not finished" in output
    assert "app log:" in output
    assert f"agentfn-asgi started: {len(tools)} tools" in output.split("app log:")[1]
    assert set(psutil.Process().children(recursive=True)) <= children
    assert not _workdir(output).exists()


@pytest.mark.exclusive
@pytest.mark.slow
def test_cli_demo_exits_0_within_seconds_from_any_folder(tmp_path: Path) -> None:
    """``python -m agentfn_asgi demo`` (what ``make demo`` runs) ends by itself, fast, from
    an empty folder, and leaves that folder empty."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "agentfn_asgi", "demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo passed" in done.stdout
    assert time.monotonic() - started < 20
    assert list(tmp_path.iterdir()) == []


def test_project_root_is_found_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_example`` finds ``examples/`` next to the package from another folder."""
    monkeypatch.chdir(tmp_path)
    assert find_project_root() == ROOT


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_apps_port_is_chosen_once_the_fake_api_listens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A port picked before the fake API binds its own can be the one the OS then gives the
    fake (CI met it once: the app could not bind, exit 3); picked after, it cannot be."""
    from contextlib import asynccontextmanager

    from agentfn_asgi.demo import play
    from agentfn_asgi.demo.process import free_port as real_port
    from agentfn_asgi.testing import serve_fake as real_serve

    events: list[str] = []

    @asynccontextmanager
    async def serving(fake: Any) -> Any:
        async with real_serve(fake) as url:
            events.append("fake listens")
            yield url

    def port() -> int:
        events.append("app port chosen")
        return real_port()

    monkeypatch.setattr(play, "serve_fake", serving)
    monkeypatch.setattr(play, "free_port", port)
    assert await run_demo(out=io.StringIO()) == 0
    assert events == ["fake listens", "app port chosen"]
