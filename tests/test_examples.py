"""The three example apps, end to end over real HTTP (their tools: ``tests/demo/test_tools.py``).

Each e2e test starts FakeAgentsAPI on a loopback port, runs the example under uvicorn in a
child process configured only through environment variables, lets the fake send real
signed webhooks to it, and asserts on what the fake received and on the refund ledger.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentfn_asgi.demo import run_example
from agentfn_asgi.testing import (
    FakeAgentsAPI,
    FakeCall,
    Submission,
    serve_fake,
    signed_delivery,
    webhook_event,
)

from .support.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
OLD_SECRET = "whsec_b2xkLXNlY3JldC1vbGQtc2VjcmV0LW9sZA=="
NEW_SECRET = "whsec_bmV3LXNlY3JldC1uZXctc2VjcmV0LW5ldw=="
CUSTOMER_123 = '{"found":true,"customer":{"name":"Example Customer","plan":"pro"}}'


# -- end to end over real HTTP ---------------------------------------------------------------

STEPS = [
    [
        FakeCall("get_customer", {"customer_id": "123"}, call_id="call_customer"),
        FakeCall(
            "create_refund", {"order_id": "ord_1", "amount_cents": 1500}, call_id="call_refund"
        ),
        FakeCall("slow_echo", {"text": "left", "delay_ms": 300}, call_id="call_echo_a"),
        FakeCall("slow_echo", {"text": "right", "delay_ms": 300}, call_id="call_echo_b"),
        FakeCall("create_refund", {"order_id": "ord_2", "amount_cents": 0}, call_id="call_bad"),
    ],
    [FakeCall("get_customer", {"customer_id": "999"}, call_id="call_customer_2")],
]


def _base_env(tmp_path: Path, base_url: str, secret: str) -> dict[str, str]:
    return {
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": base_url,
        "OPENAI_WEBHOOK_SECRET": secret,
        "AGENTFN_STORE_URL": f"sqlite:///{tmp_path / 'store.sqlite3'}",
        "EXAMPLE_LEDGER": str(tmp_path / "ledger.jsonl"),
        "AGENTFN_ADMIN_TOKEN": "",  # the operator page stays off (not mounted)
    }


async def _play(
    target: str,
    tmp_path: Path,
    *,
    steps: list[list[FakeCall]],
    env: dict[str, str] | None = None,
    fake_secret: str | None = None,
    app_secret: str | None = None,
) -> tuple[dict[str, Submission], list[dict[str, Any]], str]:
    """Run ``target`` against a loopback fake; return submissions by call id, the ledger
    lines, and the app's root URL (already stopped)."""
    port = free_port()
    webhook_url = f"http://127.0.0.1:{port}/openai/webhooks"
    fake = FakeAgentsAPI(webhook_secret=fake_secret, webhook_url=webhook_url)
    async with fake, serve_fake(fake) as base_url:
        app_env = _base_env(tmp_path, base_url, app_secret or fake.webhook_secret)
        app_env.update(env or {})
        log = tmp_path / "app.log"
        async with run_example(target, env=app_env, log_path=log, port=port) as app:
            await _check_routing(app.url, fake.webhook_secret)
            session_id = fake.create_session(steps)
            try:
                await fake.wait_idle(session_id, timeout=15)
            except TimeoutError:
                pytest.fail(f"session not finished; app log:\n{app.log()}")
            assert all(d.ok for d in fake.deliveries), app.log()
            _assert_visible_logs(log.read_text())
    ledger = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    return {s.call_id: s for s in fake.submissions}, ledger, app.url


def _assert_visible_logs(log: str) -> None:
    # The examples configure no logging, and uvicorn configures only its own loggers: the
    # package's lines are shown all the same, with time, level and logger.
    started = re.search(r"^\S+ \S+ INFO agentfn_asgi\.app: agentfn-asgi started: ", log, re.M)
    assert started, log
    assert re.search(r" INFO agentfn_asgi\.dispatch\.execution: call finished: ", log), log


async def _check_routing(root: str, secret: str) -> None:
    # Exact path and trailing slash both answered by the receiver itself, never a redirect.
    async with httpx.AsyncClient(follow_redirects=False) as http:
        for url in (root + "/openai/webhooks", root + "/openai/webhooks/"):
            body, headers = signed_delivery(
                secret, webhook_event("agent.session.in_progress", {"id": "s"})
            )
            response = await http.post(url, content=body, headers=headers)
            assert response.status_code == 200, (url, response.status_code, response.text)
            assert response.json() == {"status": "ignored"}
        home = await http.get(root + "/")
        assert home.status_code == 200
        # Without AGENTFN_ADMIN_TOKEN the operator page is not mounted at all.
        for path in ("/openai/admin", "/openai/admin/calls"):
            assert (await http.get(root + path)).status_code == 404, path


def _assert_common(submissions: dict[str, Submission], ledger: list[dict[str, Any]]) -> None:
    assert submissions["call_customer"].success
    assert submissions["call_customer"].output == CUSTOMER_123
    refund = json.loads(submissions["call_refund"].output)
    assert refund["order_id"] == "ord_1"
    assert refund["amount_cents"] == 1500
    assert refund["refund_id"].startswith("re_")
    assert submissions["call_echo_a"].output == "left"
    assert submissions["call_echo_b"].output == "right"
    bad = submissions["call_bad"]
    assert not bad.success
    assert bad.error is not None
    assert "amount_cents must be positive" in bad.error
    assert submissions["call_customer_2"].output == '{"found":false,"customer":null}'
    assert ledger == [{"call_id": "call_refund", "order_id": "ord_1", "amount_cents": 1500}]


@pytest.mark.slow
@pytest.mark.anyio
async def test_starlette_example_end_to_end(tmp_path: Path) -> None:
    """examples/starlette_app.py answers every call of a two-step session over real HTTP."""
    submissions, ledger, _ = await _play("examples.starlette_app:app", tmp_path, steps=STEPS)
    assert set(submissions) == {c.call_id for step in STEPS for c in step}
    _assert_common(submissions, ledger)


@pytest.mark.slow
@pytest.mark.anyio
async def test_fastapi_example_end_to_end_during_a_secret_rotation(tmp_path: Path) -> None:
    """examples/fastapi_app.py, configured with two secrets (old and new, comma-separated)
    during a rotation, accepts deliveries signed with the new one and answers every call."""
    submissions, ledger, _ = await _play(
        "examples.fastapi_app:app",
        tmp_path,
        steps=STEPS,
        fake_secret=NEW_SECRET,
        app_secret=f"{OLD_SECRET}, {NEW_SECRET}",
    )
    _assert_common(submissions, ledger)


@pytest.fixture
def django_db_file(tmp_path: Path) -> Path:
    """The Django example's database, migrated (orders table with ``ord_1``)."""
    db = tmp_path / "django.sqlite3"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "examples.django_app.exampleproject.settings",
        "EXAMPLE_DJANGO_DB": str(db),
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return db


@pytest.mark.slow
@pytest.mark.anyio
async def test_django_example_end_to_end(tmp_path: Path, django_db_file: Path) -> None:
    """The Django project serves the same three tools beside Django, plus an ORM-backed
    ``lookup_order``, over real HTTP with lifespan handled by the wrapper."""
    steps = [
        [*STEPS[0], FakeCall("lookup_order", {"order_id": "ord_1"}, call_id="call_order")],
        [*STEPS[1], FakeCall("lookup_order", {"order_id": "ord_404"}, call_id="call_order_2")],
    ]
    submissions, ledger, _ = await _play(
        "examples.django_app.exampleproject.asgi:application",
        tmp_path,
        steps=steps,
        env={"EXAMPLE_DJANGO_DB": str(django_db_file)},
    )
    _assert_common(submissions, ledger)
    assert json.loads(submissions["call_order"].output) == {
        "found": True,
        "order": {"order_id": "ord_1", "customer_id": "123", "total_cents": 4200},
    }
    assert submissions["call_order_2"].output == '{"found":false,"order":null}'


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize(
    "target",
    [
        "examples.starlette_app:app",
        "examples.fastapi_app:app",
        "examples.django_app.exampleproject.asgi:application",
    ],
)
async def test_examples_mount_the_operator_page_when_a_token_is_set(
    tmp_path: Path, target: str
) -> None:
    """With AGENTFN_ADMIN_TOKEN set, each example serves the operator page at /openai/admin:
    a browser is sent to the login form, a bearer client gets the overview."""
    token = "example-admin-token-0123"
    env = _base_env(tmp_path, "http://127.0.0.1:9/v1", OLD_SECRET)
    env.update(AGENTFN_ADMIN_TOKEN=token, EXAMPLE_DJANGO_DB=str(tmp_path / "django.sqlite3"))
    async with (
        run_example(target, env=env, log_path=tmp_path / "app.log") as app,
        httpx.AsyncClient(follow_redirects=False) as http,
    ):
        browser = await http.get(app.url + "/openai/admin", headers={"accept": "text/html"})
        assert browser.status_code == 303, app.log()
        assert browser.headers["location"] == "/openai/admin/login?next=%2F"
        bearer = {"authorization": f"Bearer {token}"}
        overview = await http.get(app.url + "/openai/admin/", headers=bearer)
        assert overview.status_code == 200 and "Overview" in overview.text, app.log()


@pytest.mark.slow
@pytest.mark.parametrize(
    "target",
    [
        "examples.starlette_app:app",
        "examples.fastapi_app:app",
        "examples.django_app.exampleproject.asgi:application",
    ],
)
def test_a_start_up_mistake_is_one_line_under_uvicorn(target: str, tmp_path: Path) -> None:
    """Started without a webhook secret or an API key, each example's server prints one line
    naming both problems, no traceback, and exits non-zero: with the operator page mounted
    too (it ran the app's checks at import, a 50-line traceback)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OPENAI_API_KEY", "OPENAI_WEBHOOK_SECRET", "AGENTFN_ADMIN_TOKEN")
    }
    env.update(
        AGENTFN_ADMIN_TOKEN="example-admin-token-0123",
        AGENTFN_STORE_URL=f"sqlite:///{tmp_path / 'store.sqlite3'}",
        EXAMPLE_DJANGO_DB=str(tmp_path / "django.sqlite3"),
        EXAMPLE_LEDGER=str(tmp_path / "ledger.jsonl"),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
    )
    command = [sys.executable, "-m", "uvicorn", target, "--port", str(free_port())]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output, output
    [line] = [line for line in output.splitlines() if "agentfn-asgi cannot start:" in line]
    assert "no webhook secret" in line and "no API key" in line, output
