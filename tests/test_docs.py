"""The documentation (docs/ and the README) says what the code does, and its code runs.

Every code block is run by a test here (or in test_readme.py), or is marked with the reason
it is not; the generated pages are current; every test the guarantee tables cite exists.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from agentfn_asgi import AgentWebhookApp, Config, DispatchSettings, FunctionTools
from agentfn_asgi.config import CONFIG_DOCS, DISPATCH_DOCS, DISPATCH_ENV
from agentfn_asgi.testing import FakeCall, Submission, connect
from agentfn_asgi.testing.deliveries import action_required_event, signed_delivery
from tests import configuration_page
from tests.support.docs import DOCS, ROOT, block, blocks, pages

pytestmark = pytest.mark.anyio
pytest_plugins = ["pytester"]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_" + "b3RoZXItc2VjcmV0LW90aGVyLXNlY3JldA=="


def _run(name: str, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    """Execute the named block in ``namespace`` (what the page says came before it)."""
    namespace = {} if namespace is None else namespace
    exec(compile(block(name), f"<docs block {name}>", "exec"), namespace)  # noqa: S102
    return namespace


def _configured(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment an app needs to start, with an in-memory store."""
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "AGENTFN_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OPENAI_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("AGENTFN_STORE_URL", "memory://")


def _one_tool() -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    def get_customer(customer_id: str) -> dict[str, bool]:
        """Look up a customer by ID."""
        return {"found": customer_id == "123"}

    return tools


# -- the blocks themselves ------------------------------------------------------------------


def test_every_code_block_is_run_or_says_why_not() -> None:
    """Each fenced block of the README and docs/ has a marker: ``<!-- block: NAME -->`` (a
    test runs it) or ``<!-- not run: REASON -->``; generated parts are exempt."""
    unmarked = [
        b.where()
        for path in pages()
        for b in blocks(path)
        if b.kind == "" or (b.kind != "generated" and not b.value.strip())
    ]
    assert unmarked == []


def test_every_named_block_is_run_by_a_test() -> None:
    """A block marked ``block: NAME`` is named (as a string) by a test that runs it, and no
    two blocks share a name."""
    names = [b.value for path in pages() for b in blocks(path) if b.kind == "block"]
    assert len(names) == len(set(names))
    sources = "".join(
        path.read_text(encoding="utf-8")
        for path in (ROOT / "tests").glob("test_*.py")
        if path.name in ("test_docs.py", "test_readme.py", "test_deployment.py")
    )
    assert [name for name in names if f'"{name}"' not in sources] == []


def test_the_getting_started_quick_start_is_the_readmes() -> None:
    """The getting started page repeats the README's quick start block for block (so the
    test that runs the README's runs both)."""
    pairs = [
        ("getting-started-tools", "quickstart-tools"),
        ("getting-started-app", "quickstart-app"),
        ("getting-started-env", "quickstart-env"),
        ("getting-started-uvicorn", "quickstart-uvicorn"),
        ("getting-started-fake", "quickstart-fake"),
    ]
    for page, readme in pairs:
        assert block(page) == block(readme), page


def test_every_relative_link_resolves() -> None:
    """The README's links into docs/ (and the pages' links to other files) point at files
    that exist; mkdocs --strict checks the links between pages and their anchors."""
    for path in pages():
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.relative_to(ROOT)}: {target}"


def test_the_tools_example_registers_its_three_tools() -> None:
    """The "Defining tools" example registers as shown (without a warning: the suite turns
    warnings into errors) and its definitions end with the tool_search tool."""
    namespace = _run("tools-example", {"ledger": object(), "payments": object()})
    definitions = namespace["agent_tools"]
    assert [d.get("name") for d in definitions] == [
        "get_customer",
        "ship",
        "create_refund",
        None,
    ]
    assert definitions[-1] == {"type": "tool_search"}
    ship = definitions[1]
    assert ship["defer_loading"] is True
    assert ship["parameters"]["properties"]["express"]["description"] == "Use next-day delivery."


@pytest.mark.parametrize("name", ["mount-starlette", "mount-fastapi"])
async def test_the_mounting_examples_answer_at_the_exact_path(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starlette and FastAPI as the page mounts them: the webhook URL answers with and
    without a trailing slash, never with a redirect, and its health check is reachable."""
    _configured(monkeypatch)
    namespace = _run(name, {"tools": _one_tool()})
    transport = httpx.ASGITransport(app=namespace["app"])
    async with httpx.AsyncClient(transport=transport, base_url="http://host") as http:
        for path in ("/openai/webhooks", "/openai/webhooks/"):
            answer = await http.post(path, content=b"{}")
            assert answer.status_code == 400, (path, answer.status_code)  # no webhook-* headers
        health = await http.get("/openai/webhooks/healthz")
    assert health.json()["status"] == "ok"
    await namespace["webhooks"].shutdown()


async def test_the_two_projects_example_keeps_the_projects_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two sub-apps, one per project: a delivery signed with one project's secret is refused
    (401) at the other's path and accepted at its own."""
    _configured(monkeypatch)
    monkeypatch.setenv("BILLING_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("BILLING_API_KEY", "sk-billing")
    monkeypatch.setenv("SUPPORT_WEBHOOK_SECRET", OTHER_SECRET)
    monkeypatch.setenv("SUPPORT_API_KEY", "sk-support")
    namespace = _run("two-projects", {"tools": _one_tool()})
    body, headers = signed_delivery(OTHER_SECRET, action_required_event("sess_1"))
    transport = httpx.ASGITransport(app=namespace["app"])
    async with httpx.AsyncClient(transport=transport, base_url="http://host") as http:
        refused = await http.post("/openai/billing/webhooks", content=body, headers=headers)
        support = namespace["support"]
        async with support.lifespan():
            accepted = await http.post("/openai/support/webhooks", content=body, headers=headers)
    assert (refused.status_code, accepted.status_code) == (401, 200)
    assert namespace["billing"].store is not support.store
    await namespace["billing"].shutdown()


def test_the_worker_examples_hand_their_tool_to_a_queue(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The plain ``enqueue=`` example and the Celery one register ``generate_report`` as a
    worker tool, and the app's configuration checks out with a completion secret set."""
    _configured(monkeypatch)
    monkeypatch.setenv("AGENTFN_COMPLETION_SECRET", "c" * 32)
    namespace = _run("workers-enqueue", {"redis": object()})
    tool = namespace["tools"].get("generate_report")
    assert tool is not None and tool.enqueue is namespace["push"]
    namespace["webhooks"].check()
    # The Celery example makes its app the current one, as a service's module does: in a
    # process of its own, so that no other test's Celery app shares its tasks.
    module = tmp_path / "jobs.py"
    module.write_text(
        "from agentfn_asgi import FunctionTools, ToolContext\n"
        "tools = FunctionTools()\n"
        + block("workers-celery")
        + "assert tools.get('generate_report').enqueue is not None\n"
        "assert 'agentfn_asgi.run_job' in celery_app.tasks\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, str(module)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


async def test_the_operator_page_example_mounts_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """With AGENTFN_ADMIN_TOKEN set, the page answers at /openai/admin beside the webhook."""
    from starlette.applications import Starlette

    _configured(monkeypatch)
    monkeypatch.setenv("AGENTFN_ADMIN_TOKEN", "t" * 24)
    webhooks = AgentWebhookApp(_one_tool())
    namespace = _run("operating-admin", {"webhooks": webhooks, "app": Starlette()})
    transport = httpx.ASGITransport(app=namespace["app"])
    async with httpx.AsyncClient(transport=transport, base_url="http://host") as http:
        page = await http.get("/openai/admin", headers={"Authorization": "Bearer " + "t" * 24})
    assert page.status_code == 200
    await webhooks.shutdown()


def test_the_testing_your_tools_example_passes() -> None:
    """The "Testing your tools" example defines a test; running it passes."""
    namespace = _run("testing-example")
    anyio.run(namespace["test_get_customer"])


def test_the_pytest_plugin_examples_pass(pytester: pytest.Pytester) -> None:
    """The plugin's examples, in a project laid out as they assume (``myapp.tools`` and
    ``myapp.billing``): with the ini option, then with the conftest fixtures instead, every
    example test passes in a real pytest run."""
    billing = (
        "from agentfn_asgi import FunctionTools\n"
        "tools = FunctionTools()\n"
        "@tools.function\n"
        "def refund(order_id: str) -> dict:\n"
        '    """Refund an order."""\n'
        '    return {"refund_id": "re_" + order_id}\n'
    )
    tools = block("testing-example").split("@pytest.mark.anyio")[0]
    pytester.mkpydir("myapp")
    pytester.makepyfile(**{"myapp/tools": tools, "myapp/billing": billing})
    pytester.makepyfile(
        test_tools=block("testing-plugin-tests"), test_billing=block("testing-plugin-marker")
    )
    pytester.makefile(".toml", pyproject=block("testing-plugin-ini"))
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3)
    pytester.makefile(".toml", pyproject="[tool.pytest.ini_options]\n")
    pytester.makeconftest(block("testing-plugin-conftest"))
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3)


def test_the_reconcile_hook_example_passes() -> None:
    """The "Testing a reconcile hook" example defines a test; running it passes."""
    namespace = _run("testing-reconcile")
    anyio.run(namespace["test_a_refund_made_before_the_crash_is_not_made_again"])


async def test_the_logging_example_prints_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    """The logging page's configuration, run against a live app: a call and a refused
    delivery come out as JSON objects carrying the documented fields."""
    tools = _one_tool()
    package = logging.getLogger("agentfn_asgi")
    before = (list(package.handlers), package.level)
    try:
        _run("logging-json")
        async with connect(tools) as stack:
            session = stack.fake.create_session([[FakeCall("get_customer", {"customer_id": "1"})]])
            await stack.fake.wait_idle(session)
            wrong = "whsec_" + "A" * 32
            body, headers = signed_delivery(wrong, action_required_event(session))
            assert (await stack.post_webhook(body, headers)).status_code == 401
    finally:
        package.handlers[:] = before[0]
        package.setLevel(before[1])
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    (finished,) = [line for line in lines if line["message"].startswith("call finished")]
    assert finished["call_id"] and finished["session_id"] == session
    assert finished["outcome"] == "success" and finished["logger"].startswith("agentfn_asgi.")
    (refused,) = [line for line in lines if line.get("reason") == "bad_signature"]
    assert refused["level"] == "WARNING" and "OPENAI_WEBHOOK_SECRET" in refused["message"]


# -- generated and cross-checked pages ------------------------------------------------------


def test_the_configuration_page_is_generated_from_the_code() -> None:
    """docs/configuration.md's tables are `python -m tests.configuration_page` output; run
    `python -m tests.configuration_page --write` after changing a setting."""
    text = configuration_page.PAGE.read_text(encoding="utf-8")
    assert configuration_page.page_section(text) == configuration_page.markdown()


def test_the_tool_options_table_is_generated_from_the_code() -> None:
    """docs/tools.md's per-tool options table is `python -m tests.configuration_page` output
    too: every option of ``@tools.function`` (``ToolOptions``) with its type, its default and
    its documentation (``DEFINITION_OPTIONS`` and the ``ToolPolicy`` fields)."""
    text = configuration_page.TOOLS_PAGE.read_text(encoding="utf-8")
    section = configuration_page.page_section(
        text, configuration_page.OPTIONS_BEGIN, configuration_page.OPTIONS_END
    )
    assert section == configuration_page.tool_options_markdown()
    assert "| `max_wait=` | `float` or `None` | 300 s |" in section


@pytest.mark.slow
def test_the_site_renders_every_cross_reference_of_the_reference(tmp_path: Path) -> None:
    """``mkdocs build --strict`` passes, and the API reference shows no Sphinx role as
    written: the docstrings' ``:class:`~x.Y``` and friends are links
    (docs_hooks/sphinx_roles.py), or plain code where the site does not render the object.
    The test kit's ``connect`` and ``Submission``'s fields are shown, and an escaped pipe in
    a table's code shows as a pipe (docs_hooks/table_pipes.py)."""
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    reference = (site / "reference" / "index.html").read_text(encoding="utf-8")
    raw = re.findall(r":(?:class|meth|func|attr|mod|data|exc|obj):(?:<code>|`)[^<`]*", reference)
    assert raw == []
    link = r'<a class="autorefs autorefs-internal"[^>]*href="#agentfn_asgi\.Config"'
    assert re.search(link, reference), "a role naming a rendered object is a link"
    assert 'id="agentfn_asgi.testing.connect.connect"' in reference
    submission = reference.split('id="agentfn_asgi.testing.Submission"', 1)[1][:3000]
    assert all(f"{field.name}" in submission for field in dataclasses.fields(Submission))
    tools = (site / "tools" / "index.html").read_text(encoding="utf-8")
    assert "\\|" not in tools and "Ran | NotRun | Unknown" in tools


def test_every_setting_is_documented() -> None:
    """Every Config and DispatchSettings field has its entry, every variable the config
    module reads is on the page, and every option of AgentWebhookApp is in its docstring."""
    assert set(CONFIG_DOCS) == {f.name for f in dataclasses.fields(Config)}
    assert set(DISPATCH_DOCS) == {f.name for f in dataclasses.fields(DispatchSettings)}
    from agentfn_asgi import config

    source = Path(config.__file__).read_text(encoding="utf-8")
    read = set(re.findall(r'env\.get\("((?:OPENAI|AGENTFN|OTEL)_[A-Z_]+)"', source))
    read |= set(re.findall(r'text\("((?:OPENAI|AGENTFN|OTEL)_[A-Z_]+)"\)', source))
    documented = {doc.variable for doc in CONFIG_DOCS.values()} | set(DISPATCH_ENV)
    assert read - documented == set()
    page = configuration_page.PAGE.read_text(encoding="utf-8")
    assert {name for name in documented if name and name not in page} == set()
    options = configuration_page.app_options()
    assert {name for name, (_default, meaning) in options.items() if not meaning} == set()


def test_every_test_the_docs_cite_exists() -> None:
    """The guarantee and reliability tables (and any page) name the tests that prove each
    row: each named test function exists, so a renamed test cannot leave a claim without
    its proof."""
    text = "".join(path.read_text(encoding="utf-8") for path in pages())
    # Function names only: not file names (``test_x.py``), not the pages' own examples.
    examples = "".join(b.code for path in pages() for b in blocks(path))
    own = set(re.findall(r"def (test_[a-z0-9_]+)\(", examples))
    cited = set(re.findall(r"\b(test_[a-z0-9_]+)\b(?!\.py)", text)) - own
    assert "test_crash_restart_and_redelivery" in cited  # the tables are where they should be
    tests = Path(__file__).resolve().parent
    defined = {
        name
        for path in tests.rglob("*.py")
        for name in re.findall(r"def (test_[a-z0-9_]+)\(", path.read_text(encoding="utf-8"))
    }
    assert cited - defined == set()


def test_the_docs_cite_pages_that_exist() -> None:
    """The package's docstrings cite "wire protocol §N" and the architecture page: both
    pages exist and the wire protocol has every section cited."""
    cited: set[str] = set()
    for path in (ROOT / "agentfn_asgi").rglob("*.py"):
        for match in re.findall(r"wire protocol (§[\d.]+(?:, §[\d.]+)*)", path.read_text()):
            cited |= {part.strip("§ ") for part in match.split(",")}
    assert cited, "no docstring cites the wire protocol page"
    wire = (DOCS / "how-it-works" / "wire-protocol.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^#+ ([\d.]+?)\.? ", wire, re.MULTILINE))
    assert cited - headings == set()
    assert (DOCS / "how-it-works" / "architecture.md").exists()


def test_no_page_refers_to_the_old_readme_sections() -> None:
    """The docs, the READMEs and the package's docstrings point at pages, not at README
    sections that moved (the README is short now) or at design notes outside the
    repository."""
    readmes = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
    for path in [*pages(), *readmes, *(ROOT / "agentfn_asgi").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        assert "README's" not in text and "DESIGN.md" not in text, path


def test_every_test_file_the_docs_cite_exists() -> None:
    """A test file named by a page (``tests/…/test_x.py``) exists: a moved file cannot
    leave a claim pointing nowhere."""
    text = "".join(path.read_text(encoding="utf-8") for path in pages())
    root = Path(__file__).resolve().parent.parent
    cited = set(re.findall(r"\b(tests/[\w/]+\.py)\b", text))
    assert cited, "no page names a test file"
    assert {path for path in cited if not (root / path).is_file()} == set()


def test_the_docs_speak_to_users_not_about_how_the_project_is_run() -> None:
    """The README and the pages describe the package, not the work on it: no goals "filed",
    no "this round", no issue numbers, no "other issues"."""
    process = re.compile(
        r"\b(filed|this round|round (?:one|two|three)|issues? #?\d+|other issues)\b", re.IGNORECASE
    )
    found = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
        for path in pages()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for match in process.finditer(line)
    ]
    assert found == []


def test_the_version_is_written_once_and_released_in_the_changelog() -> None:
    """The installed metadata's version is ``agentfn_asgi.__version__`` (pyproject.toml
    reads it from ``agentfn_asgi/_version.py``), it follows SemVer, and the changelog's
    newest release is that version, under an ``Unreleased`` section (Keep a Changelog)."""
    import importlib.metadata

    import agentfn_asgi

    version = agentfn_asgi.__version__
    assert importlib.metadata.version("agentfn-asgi") == version
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynamic = ["version"]' in pyproject and 'path = "agentfn_asgi/_version.py"' in pyproject
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, re.MULTILINE)
    assert headings[:2] == ["Unreleased", version]
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")


async def test_the_actions_page_policies_decide_as_it_says() -> None:
    """The pending actions page: its ActionRules builds an app and decides each example the
    page names; its callable policy decides the same kinds of request."""
    from agentfn_asgi import MCPRequest, OriginRequest, SignInRequest
    from agentfn_asgi.actions import decide

    namespace = _run("actions-rules", {"tools": _one_tool()})
    assert isinstance(namespace["webhooks"], AgentWebhookApp)
    ids = {"session_id": "s", "turn_id": "t", "request_id": "r"}
    rules = namespace["ActionRules"](
        mcp={"docs": "approve", "payments": "ask"},
        other_mcp="deny",
        origins={"https://example.com": "approve"},
        other_origins="ask",
        sign_in="cancel",
    )
    assert rules(OriginRequest(**ids, origin="https://docs.example.com")) == "approve"
    assert rules(OriginRequest(**ids, origin="https://example.com.evil.test")) == "ask"
    assert rules(MCPRequest(**ids, server_label="shell")) == "deny"
    policy = _run("actions-callable")["decide"]
    assert await decide(policy, MCPRequest(**ids, server_label="docs")) == "approve"
    assert await decide(policy, OriginRequest(**ids, origin="https://x.test")) == "deny"
    assert (
        await decide(policy, SignInRequest(session_id="s", turn_id="t", request_id="r")) == "cancel"
    )


def test_the_actions_page_sign_in_hook_builds_an_app() -> None:
    from agentfn_asgi import SignIn, SignInRequest

    vault = {"user": "ada", "password": "pw"}
    namespace = _run("actions-sign-in", {"tools": _one_tool(), "vault": vault})
    assert isinstance(namespace["webhooks"], AgentWebhookApp)
    hook = namespace["sign_in"]
    elsewhere = SignInRequest(
        session_id="s", turn_id="t", request_id="r", credential_origin="https://other.test"
    )
    assert hook(elsewhere) is None
    answer = hook(dataclasses.replace(elsewhere, credential_origin="https://id.example.com"))
    assert isinstance(answer, SignIn) and answer.values["password"] == "pw"
    assert "pw" not in repr(answer)


@pytest.mark.anyio
async def test_the_actions_page_connect_environment_hook_builds_an_app() -> None:
    from agentfn_asgi import EnvironmentConnection

    started: list[str] = []

    class Orchestrator:
        async def ensure_running(self, environment_id: str) -> None:
            started.append(environment_id)

    namespace = _run(
        "actions-connect-environment", {"tools": _one_tool(), "orchestrator": Orchestrator()}
    )
    assert isinstance(namespace["webhooks"], AgentWebhookApp)
    await namespace["connect_environment"](
        EnvironmentConnection(session_id="s", environment_id="env_1")
    )
    assert started == ["env_1"]
