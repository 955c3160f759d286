"""The CLI's parser: a mistyped option or subcommand gets the closest one suggested, from
the (sub)command it was given to, with exit code 2 as argparse's own errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from agentfn_asgi.cli import main
from agentfn_asgi.store import open_store


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["webhooks", "list", "--jsn"],
            "agentfn-asgi webhooks list: error: unrecognized arguments: --jsn "
            "(did you mean --json?)",
        ),
        (
            ["webhooks", "test", "we_1", "--evnt", "agent.session.idle"],
            "(did you mean --event?)",
        ),
        (["webhooks", "rotate-secret", "we_1", "--keep-odl"], "(did you mean --keep-old?)"),
        (["calls", "show", "call_1", "--sesion=s"], "(did you mean --session?)"),
        (["status", "--stroe", "sqlite:///x"], "(did you mean --store?)"),
        (["webhooks", "lst"], "invalid choice: 'lst'"),
        (["webhooks", "lst"], "(did you mean 'list'?)"),
        (["statsu"], "(did you mean 'status'?)"),
        (["calls", "--state", "helds"], "invalid choice: 'helds'"),
    ],
)
def test_a_typo_gets_a_suggestion(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2, the usage of the command concerned and the closest option or choice."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert said in err
    assert "Traceback" not in err


def test_no_suggestion_when_nothing_is_close(capsys: pytest.CaptureFixture[str]) -> None:
    """Far from every option: argparse's message alone."""
    with pytest.raises(SystemExit):
        main(["webhooks", "list", "--zzzzzzzz"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzzzzz\n" in err and "did you mean" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["tools", "agentfn_asgi.demo.tools:tools"],
        ["calls", "--store", "STORE"],
        ["status", "--store", "STORE"],
        ["deliveries", "--store", "STORE"],
    ],
)
def test_a_reader_that_went_away_ends_the_command_quietly(argv: list[str], tmp_path: Path) -> None:
    """``calls ... | head``: the reader closes the pipe before the command has printed. It
    ended in a BrokenPipeError traceback; now nothing is printed and the exit code is 141,
    as for any tool killed by SIGPIPE."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    anyio.run(_create_store, url)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    try:
        done = subprocess.run(
            [sys.executable, "-m", "agentfn_asgi", *[url if a == "STORE" else a for a in argv]],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 141


async def _create_store(url: str) -> None:
    store = open_store(url)
    await store.open()
    await store.close()
