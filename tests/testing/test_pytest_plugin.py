"""The pytest plugin (``pytest_agentfn``, the ``pytest11`` entry point): its fixtures in a
real inner pytest run, where the tools come from, its errors, and that a suite which does
not use it never imports the package."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TOOLS = '''
from agentfn_asgi import FunctionTools

tools = FunctionTools()

@tools.function
def get_customer(customer_id: str) -> dict:
    """Look up a customer by ID."""
    return {"found": customer_id == "123"}
'''


def test_the_fixtures_serve_the_tools_the_ini_option_names(pytester: pytest.Pytester) -> None:
    """With ``agentfn_tools = MODULE:ATTR`` an unmarked async test gets a connected app:
    ``agentfn.call`` returns the submitted result; a wrong expectation fails as a test
    failure, and each test has an app, a fake and a store of its own."""
    pytester.makepyfile(mytools=TOOLS)
    pytester.makeini("[pytest]\nagentfn_tools = mytools:tools\n")
    pytester.makepyfile(
        test_customers="""
        from agentfn_asgi.testing import FakeCall

        async def test_found(agentfn):
            result = await agentfn.call("get_customer", {"customer_id": "123"})
            assert result.success and result.output == '{"found":true}'
            assert len(agentfn.fake.submissions) == 1

        async def test_steps_through_the_fake(agentfn, agentfn_fake):
            assert agentfn.fake is agentfn_fake and agentfn_fake.submissions == []
            call = FakeCall("get_customer", {"customer_id": "9"})
            session = agentfn_fake.create_session([[call]])
            await agentfn_fake.wait_idle(session)
            [result] = agentfn_fake.submissions
            assert result.output == '{"found":true}'   # wrong on purpose: it is false
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_steps_through_the_fake*", "*'{\"found\":false}'*"])


def test_a_marker_or_a_fixture_names_the_tools_and_the_options(pytester: pytest.Pytester) -> None:
    """An ``agentfn_tools`` fixture of the suite's serves its registry; the marker's
    ``tools`` wins over it and its other keywords go to ``connect()`` (here the mount
    path); an ``agentfn_fake`` of the suite's is the one the app talks to."""
    pytester.makepyfile(mytools=TOOLS)
    pytester.makeconftest(
        """
        import pytest
        from agentfn_asgi.testing import FakeAgentsAPI
        from mytools import tools

        @pytest.fixture
        def agentfn_tools():
            return tools

        @pytest.fixture
        async def agentfn_fake():
            async with FakeAgentsAPI(api_key="sk-mine") as fake:
                yield fake
        """
    )
    pytester.makepyfile(
        test_marked="""
        import pytest
        from agentfn_asgi import FunctionTools

        other = FunctionTools()

        @other.function
        def echo(text: str) -> str:
            "Say it back."
            return text

        async def test_from_the_fixture(agentfn):
            assert agentfn.fake.api_key == "sk-mine"
            assert (await agentfn.call("get_customer", {"customer_id": "1"})).success

        @pytest.mark.agentfn(tools=other, mount_path="/hooks")
        async def test_from_the_marker(agentfn):
            assert agentfn.webhook_url.endswith("/hooks")
            assert (await agentfn.call("echo", {"text": "hi"})).output == "hi"

        @pytest.mark.agentfn(tools="mytools:tools", store="memory://")
        async def test_a_spec_in_the_marker(agentfn):
            assert (await agentfn.call("get_customer", {"customer_id": "123"})).success
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3)


def test_missing_or_wrong_tools_are_one_line_errors(pytester: pytest.Pytester) -> None:
    """Without a registry the fixture says the three ways to give one; a spec that does
    not import, or a marker given something else, names what was wrong. No traceback. A
    suite whose own ``anyio_backend`` is another loop than asyncio gets a skip."""
    pytester.makepyfile(
        test_wrong="""
        import pytest

        async def test_no_tools(agentfn):
            pass

        @pytest.mark.agentfn(tools="nosuchmodule:tools")
        async def test_bad_spec(agentfn):
            pass

        @pytest.mark.agentfn(tools=42)
        async def test_not_a_registry(agentfn):
            pass
        """,
        test_trio="""
        import pytest

        @pytest.fixture
        def anyio_backend():
            return "trio"

        async def test_on_trio(agentfn_fake):
            pass
        """,
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(errors=3, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*the agentfn fixture needs your tools: set 'agentfn_tools = MODULE:ATTR'*",
            "*@pytest.mark.agentfn(tools=...): cannot import 'nosuchmodule'*",
            "*@pytest.mark.agentfn(tools=...) must be a FunctionTools or 'MODULE:ATTR', got int*",
            "*agentfn-asgi runs on asyncio, not trio*",
        ]
    )
    assert "Traceback" not in result.stdout.str()


@pytest.mark.slow
def test_a_suite_that_does_not_use_it_does_not_import_the_package(
    pytester: pytest.Pytester,
) -> None:
    """The plugin is loaded in every suite of the environment (entry point) but imports
    nothing of agentfn_asgi until a fixture of it runs."""
    pytester.makepyfile(
        test_plain="""
        import sys

        def test_untouched():
            assert "pytest_agentfn" in sys.modules
            assert [m for m in sys.modules if m.startswith("agentfn_asgi")] == []
        """
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
