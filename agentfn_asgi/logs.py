"""The package's log lines are visible where the host configured no logging.

Every logger of the package is under ``agentfn_asgi``. A host that configures logging (a
handler on the root logger: ``logging.basicConfig``, ``dictConfig``, ``uvicorn --log-config``,
Django's ``LOGGING``, gunicorn) decides where they go, and this module stays out of the way.
A host that configured nothing (plain ``uvicorn myservice:app`` configures only uvicorn's own
loggers) would otherwise see nothing of the start-up line, refused deliveries or ``call
finished``, and its warnings would reach Python's last-resort handler without level,
logger or time. :func:`show_by_default`, called at start-up, then gives the
``agentfn_asgi`` logger a handler of its own, at INFO, printing to standard error::

    2026-12-03 13:02:11,532 INFO agentfn_asgi.app: agentfn-asgi started: 3 tools, store ...

That handler defers to the host the moment the host configures logging after all: from then
on it hands each line to the root logger's handlers (at the root logger's level) and prints
nothing itself, so no line is ever printed twice.
"""

from __future__ import annotations

import logging
import sys
import time

__all__ = ["PACKAGE_LOGGER", "one_line_start_failure", "show_by_default"]

#: The parent of every logger of the package.
PACKAGE_LOGGER = "agentfn_asgi"
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Formatter(logging.Formatter):
    """``_FORMAT``, written the cheap way: the date and time to the second is formatted
    once a second, not per line, and the fields are joined by an f-string (a ``call
    finished`` line 21 → 19 µs, timed). The text is exactly ``logging.Formatter(_FORMAT)``'s,
    tracebacks included (``format`` appends them as before)."""

    def __init__(self) -> None:
        super().__init__(_FORMAT)
        self._second: int | None = None
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return f"{self._stamp},{int(record.msecs):03d}"

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802
        return f"{record.asctime} {record.levelname} {record.name}: {record.message}"


class _UntilConfigured(logging.StreamHandler):  # type: ignore[type-arg]
    """Prints to standard error while the root logger has no handler; afterwards passes each
    record to the root logger's handlers, as propagation would have."""

    def emit(self, record: logging.LogRecord) -> None:
        root = logging.getLogger()
        if root.handlers:
            if record.levelno >= root.getEffectiveLevel():
                root.handle(record)
            return
        super().emit(record)


def show_by_default() -> bool:
    """Make the package's INFO lines visible when the host configured no logging at all.

    Does nothing (returns False) when the root logger has a handler, or when the host
    configured the ``agentfn_asgi`` logger itself (a handler or a level on it). Idempotent.
    """
    package = logging.getLogger(PACKAGE_LOGGER)
    if logging.getLogger().handlers or package.handlers or package.level != logging.NOTSET:
        return False
    handler = _UntilConfigured(sys.stderr)
    handler.setFormatter(_Formatter())
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    # The handler hands records to the root logger itself once it has handlers.
    package.propagate = False
    return True


class _OneLine(logging.Filter):
    """Rewrites the server's one record of a start-up failure caused by ``message`` (a
    traceback ending in that configuration error) into one line, then removes itself."""

    def __init__(self, logger: logging.Logger, message: str) -> None:
        super().__init__()
        self._logger = logger
        self._message = message

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text.startswith("Traceback") and text.rstrip().endswith(self._message):
            record.msg, record.args = "agentfn-asgi cannot start: %s", (self._message,)
            self._logger.removeFilter(self)
        return True


def one_line_start_failure(message: str) -> None:
    """Make a configuration error at start-up read as one line under uvicorn.

    Starlette (and so FastAPI) reports a lifespan that raised with the whole traceback, which
    uvicorn prints as one ERROR record; for a configuration error those frames say nothing
    the message does not. This rewrites that one record (uvicorn's ``uvicorn.error`` logger)
    into ``agentfn-asgi cannot start: <message>``, and touches no other record. Under other
    servers nothing changes. An app served directly, or through the Django integration,
    reports the message alone already.
    """
    logger = logging.getLogger("uvicorn.error")
    logger.addFilter(_OneLine(logger, message))
