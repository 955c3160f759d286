"""The pytest plugin of agentfn-asgi's test kit: ready fixtures instead of ``connect()``.

Installed with the package (the ``pytest11`` entry point), so every test suite in an
environment that has agentfn-asgi sees it. It therefore imports nothing of the package
until one of its fixtures is used: a suite that never asks for them pays nothing. It lives
outside ``agentfn_asgi`` because importing any module of the package imports the package.

Fixtures (async ones run on anyio's pytest plugin, which comes with the package's
dependencies; a test that uses them runs on asyncio without a marker):

- ``agentfn``: a :class:`~agentfn_asgi.testing.Connection`, the app serving your tools
  wired both ways to the fake (what ``async with connect(tools) as conn:`` yields); closed
  after the test.
- ``agentfn_fake``: the :class:`~agentfn_asgi.testing.FakeAgentsAPI` it talks to; override
  it to configure the fake (its secret, retry schedule, faults).
- ``agentfn_tools``: the :class:`~agentfn_asgi.FunctionTools` served. Override it, or name
  the registry once with the ini option ``agentfn_tools = MODULE:ATTR``.

The marker ``@pytest.mark.agentfn(tools=..., **options)`` sets one test's (or module's)
registry (a ``FunctionTools`` or ``"MODULE:ATTR"``) and ``connect()`` options (``store``,
``mount_path``, ``loopback``, ``settings``, ...).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from agentfn_asgi import FunctionTools
    from agentfn_asgi.testing import Connection, FakeAgentsAPI

__all__ = ["agentfn", "agentfn_fake", "agentfn_tools"]

_INI = "agentfn_tools"
_MARKER = "agentfn"
_FIXTURES = frozenset({"agentfn", "agentfn_fake"})


def pytest_addoption(parser: pytest.Parser) -> None:
    """Declare the ini option naming the registry the ``agentfn`` fixture serves."""
    parser.addini(
        _INI,
        "MODULE:ATTR of the FunctionTools (or AgentWebhookApp) the agentfn fixture serves",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker (suites run with ``--strict-markers``)."""
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(tools=None, **options): the registry (FunctionTools or 'MODULE:ATTR') and "
        "connect() options of the agentfn fixture",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the copies of a test using the fixtures that anyio's default
    ``anyio_backend`` makes for other event loops (trio, when installed): the package runs
    on asyncio. A suite's own ``anyio_backend`` choosing another loop gets a skip instead."""
    chosen, left_out = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        backend = params.get("anyio_backend", "asyncio")
        uses_fixtures = _FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if uses_fixtures and _backend_name(backend) != "asyncio":
            left_out.append(item)
        else:
            chosen.append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = chosen


def _load(spec: str, where: str) -> FunctionTools:
    from agentfn_asgi.cli.common import load_tools
    from agentfn_asgi.errors import AgentFnError

    try:
        return load_tools(spec)
    except AgentFnError as exc:
        problem = str(exc)
    pytest.fail(f"{where}: {problem}", pytrace=False)


def _registry(value: object, where: str) -> FunctionTools:
    from agentfn_asgi import FunctionTools

    if isinstance(value, str):
        return _load(value, where)
    if not isinstance(value, FunctionTools):
        pytest.fail(
            f"{where} must be a FunctionTools or 'MODULE:ATTR', got {type(value).__name__}",
            pytrace=False,
        )
    return value


def _marked_tools(request: pytest.FixtureRequest) -> FunctionTools | None:
    marker = request.node.get_closest_marker(_MARKER)
    if marker is None or "tools" not in marker.kwargs:
        return None
    return _registry(marker.kwargs["tools"], "@pytest.mark.agentfn(tools=...)")


@pytest.fixture
def agentfn_tools(request: pytest.FixtureRequest) -> FunctionTools:
    """The registry the ``agentfn`` fixture serves: the ini option ``agentfn_tools``.

    Override this fixture (in a ``conftest.py`` or a test module) to return your
    ``FunctionTools`` instead; ``@pytest.mark.agentfn(tools=...)`` wins over both.
    """
    marked = _marked_tools(request)
    if marked is not None:
        return marked
    spec = request.config.getini(_INI)
    if not spec:
        pytest.fail(
            "the agentfn fixture needs your tools: set 'agentfn_tools = MODULE:ATTR' in the "
            "pytest ini options, define a fixture agentfn_tools returning your FunctionTools, "
            "or mark the test @pytest.mark.agentfn(tools=...)",
            pytrace=False,
        )
    return _load(str(spec), f"ini option {_INI} = {spec}")


def _backend_name(anyio_backend: object) -> object:
    return anyio_backend[0] if isinstance(anyio_backend, tuple) else anyio_backend


def _asyncio_only(anyio_backend: object) -> None:
    backend = _backend_name(anyio_backend)
    if backend != "asyncio":
        pytest.skip(f"agentfn-asgi runs on asyncio, not {backend}")


@pytest.fixture
async def agentfn_fake(anyio_backend: object) -> AsyncIterator[FakeAgentsAPI]:
    """A :class:`~agentfn_asgi.testing.FakeAgentsAPI`, closed after the test.

    Override it to configure the fake; yield it from ``async with``, as here.
    """
    _asyncio_only(anyio_backend)
    from agentfn_asgi.testing import FakeAgentsAPI

    async with FakeAgentsAPI() as fake:
        yield fake


@pytest.fixture
async def agentfn(
    request: pytest.FixtureRequest,
    anyio_backend: object,
    agentfn_tools: FunctionTools,
    agentfn_fake: FakeAgentsAPI,
) -> AsyncIterator[Connection]:
    """The app serving your tools, wired to ``agentfn_fake``: ``connect(tools, fake)``.

    The tools come from ``@pytest.mark.agentfn(tools=...)``, else the ``agentfn_tools``
    fixture; the marker's other keywords are ``connect()``'s options. The app is started
    before the test and shut down after it.
    """
    _asyncio_only(anyio_backend)
    from agentfn_asgi.testing import connect

    marker = request.node.get_closest_marker(_MARKER)
    if marker and marker.args:
        pytest.fail("@pytest.mark.agentfn takes keywords only: agentfn(tools=...)", pytrace=False)
    options: dict[str, Any] = dict(marker.kwargs) if marker else {}
    # A registry of the marker wins over an agentfn_tools fixture of the user's.
    tools = _marked_tools(request)
    if tools is None:
        tools = _registry(agentfn_tools, "the agentfn_tools fixture")
    options.pop("tools", None)
    async with connect(tools, agentfn_fake, **options) as connection:
        yield connection
