"""The package's lines are visible where the host configured no logging, and the host's
configuration wins the moment it has one."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Callable, Iterator

import pytest

from agentfn_asgi import logs


@pytest.fixture
def bare_logging(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[[], str]]:
    """No handler anywhere (as under plain uvicorn; a test calls :func:`_bare` first, since
    pytest adds its capture handlers around the test itself), standard error captured; the
    logging set-up of the test run is put back afterwards. Yields: what reached stderr."""
    root, package = logging.getLogger(), logging.getLogger(logs.PACKAGE_LOGGER)
    saved = (root.handlers[:], root.level, package.handlers[:], package.level, package.propagate)
    root.handlers.clear()
    package.handlers.clear()
    package.setLevel(logging.NOTSET)
    try:
        yield lambda: capsys.readouterr().err
    finally:
        root.handlers[:], package.handlers[:] = saved[0], saved[2]
        root.setLevel(saved[1])
        package.setLevel(saved[3])
        package.propagate = saved[4]


def _bare() -> None:
    logging.getLogger().handlers.clear()


def test_with_no_logging_configured_info_lines_are_printed(bare_logging: Callable[[], str]) -> None:
    """INFO lines of any package logger reach standard error with time, level and logger."""
    _bare()
    assert logs.show_by_default() is True
    assert logs.show_by_default() is False  # once
    logging.getLogger("agentfn_asgi.app").info("agentfn-asgi started: %d tools", 3)
    line = bare_logging()
    assert " INFO agentfn_asgi.app: agentfn-asgi started: 3 tools\n" in line
    assert line[:4].isdigit()  # the time comes first


def test_the_host_configuring_logging_later_takes_over(bare_logging: Callable[[], str]) -> None:
    """Once the root logger has a handler, lines go there (at its level), never twice."""
    _bare()
    logs.show_by_default()
    hosts = io.StringIO()
    handler = logging.StreamHandler(hosts)
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.WARNING)
    execution = logging.getLogger("agentfn_asgi.dispatch.execution")
    execution.info("call finished: below the host's level")
    execution.warning("a call left for recovery")
    assert bare_logging() == ""
    assert hosts.getvalue() == "a call left for recovery\n"


def test_a_host_that_configured_logging_is_left_alone(bare_logging: Callable[[], str]) -> None:
    """A root handler, or a level set on the package's logger, means: the host decides."""
    _bare()
    logging.getLogger().addHandler(logging.NullHandler())
    assert logs.show_by_default() is False
    logging.getLogger().handlers.clear()
    logging.getLogger(logs.PACKAGE_LOGGER).setLevel(logging.WARNING)
    assert logs.show_by_default() is False
    assert logging.getLogger(logs.PACKAGE_LOGGER).handlers == []


def test_the_default_line_is_the_standard_formatters_to_the_character() -> None:
    """The handler's formatter (the time formatted once a second) writes exactly what
    ``logging.Formatter`` with the same format would, across seconds and with a traceback."""
    ours, standard = logs._Formatter(), logging.Formatter(logs._FORMAT)
    logger = logging.getLogger("agentfn_asgi.dispatch.execution")
    try:
        raise ValueError("boom")
    except ValueError:
        failure = sys.exc_info()
    for i, created in enumerate((1764760000.0, 1764760000.9994, 1764760001.5, 1764760000.25)):
        record = logger.makeRecord(
            logger.name, logging.INFO, __file__, 1, "call finished: tool=%s n=%d", ("é", i), None
        )
        record.created, record.msecs = created, (created - int(created)) * 1000
        if i == 2:
            record.exc_info, record.levelno, record.levelname = failure, logging.ERROR, "ERROR"
        assert ours.format(record) == standard.format(record)
