"""The CLI's parser: a mistyped option or subcommand gets the closest one suggested, from
the (sub)command it was given to, with exit code 2 as argparse's own errors."""

from __future__ import annotations

import pytest

from agentfn_asgi.cli import main


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
