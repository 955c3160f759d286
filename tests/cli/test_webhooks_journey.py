"""Going live from the terminal, as subprocesses against ``agentfn-asgi fake-api``:
``webhooks create`` prints the secret, the Starlette example started with it answers
``webhooks test`` with 200 and a real session's calls, ``rotate-secret --keep-old`` prints
both secrets and a restarted app accepts deliveries signed with either, ``delete`` ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from agentfn_asgi.demo import run_example
from agentfn_asgi.demo.process import RunningExample
from tests.support.ports import free_port

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

API_KEY = "sk-journey"


@dataclass
class Done:
    code: int
    out: str
    err: str


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without OPENAI_*/AGENTFN_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGENTFN_"))}
    return {**env, **extra}


async def agentfn(*argv: str, env: dict[str, str]) -> Done:
    """``python -m agentfn_asgi ARGV`` to completion."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentfn_asgi",
        *argv,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    done = Done(process.returncode, out.decode(), err.decode())
    assert API_KEY not in done.out + done.err  # the API key is never printed
    return done


@contextlib.asynccontextmanager
async def fake_api() -> AsyncIterator[str]:
    """``agentfn-asgi fake-api --port 0`` until the block ends; yields its base URL."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentfn_asgi",
        "fake-api",
        "--port",
        "0",
        "--api-key",
        API_KEY,
        env=_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), timeout=30)
        assert line.startswith(b"FakeAgentsAPI listening on "), line
        yield line.decode().split()[-1]
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), timeout=20)


@contextlib.asynccontextmanager
async def example_app(
    tmp_path: Path, base_url: str, secret: str, port: int, name: str
) -> AsyncIterator[RunningExample]:
    """The Starlette example under uvicorn with ``OPENAI_WEBHOOK_SECRET=secret``."""
    env = {
        "OPENAI_API_KEY": API_KEY,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_WEBHOOK_SECRET": secret,
        "AGENTFN_STORE_URL": f"sqlite:///{tmp_path / 'store.sqlite3'}",
        "EXAMPLE_LEDGER": str(tmp_path / "ledger.jsonl"),
        "AGENTFN_ADMIN_TOKEN": "",
    }
    async with run_example(
        "examples.starlette_app:app", env=env, log_path=tmp_path / f"{name}.log", port=port
    ) as app:
        yield app


def _secret_line(out: str) -> str:
    (line,) = out.splitlines()
    name, _, value = line.partition("=")
    assert name == "OPENAI_WEBHOOK_SECRET" and value.startswith("whsec_"), out
    return value


async def test_create_test_rotate_restart_delete(tmp_path: Path) -> None:
    """The whole journey; each step's exit code and output as a user sees them."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/openai/webhooks"
    async with fake_api() as base_url:
        cli_env = _env(OPENAI_API_KEY=API_KEY, OPENAI_BASE_URL=base_url)

        created = await agentfn("webhooks", "create", "--url", url, env=cli_env)
        assert created.code == 0, created.err
        old = _secret_line(created.out)
        listed = await agentfn("webhooks", "list", "--json", env=cli_env)
        (endpoint,) = json.loads(listed.out)
        assert endpoint["url"] == url
        assert endpoint["event_types"] == [
            "agent.session.action_required",
            "agent.session.idle",
            "agent.session.failed",
        ]
        endpoint_id = endpoint["id"]

        async with example_app(tmp_path, base_url, old, port, "first") as app:
            tested = await agentfn("webhooks", "test", endpoint_id, env=cli_env)
            assert (tested.code, tested.out) == (0, "200 OK\n"), tested.err + app.log()
            # A real session: the fake delivers to the endpoint, signed with its secret.
            root = base_url.removesuffix("/v1")
            async with httpx.AsyncClient() as http:
                made = await http.post(
                    f"{root}/_fake/sessions",
                    json={"calls": [{"name": "get_customer", "arguments": {"customer_id": "1"}}]},
                )
                assert made.status_code == 201
                async with asyncio.timeout(20):
                    while not (await http.get(f"{root}/_fake/submissions")).json():
                        await asyncio.sleep(0.05)

            rotated = await agentfn(
                "webhooks",
                "rotate-secret",
                endpoint_id,
                "--keep-old",
                env={**cli_env, "OPENAI_WEBHOOK_SECRET": old},
            )
            assert rotated.code == 0, rotated.err
            both = _secret_line(rotated.out)
            new, kept = both.split(",")
            assert kept == old and new != old

        async with example_app(tmp_path, base_url, both, port, "second") as app:
            tested = await agentfn("webhooks", "test", endpoint_id, env=cli_env)
            assert (tested.code, tested.out) == (0, "200 OK\n"), tested.err + app.log()
            for secret in (new, old):  # the restarted app accepts either secret alone
                sent = await agentfn(
                    "send", url, "--secret", secret, "--type", "agent.session.idle", env=cli_env
                )
                assert sent.code == 0 and sent.out.startswith("200 OK"), sent.out + sent.err
            other = "whsec_dGhlLW90aGVyLXNlY3JldC1rZXktMTIzNDU2Nzg="
            refused = await agentfn(
                "send", url, "--secret", other, "--type", "agent.session.idle", env=cli_env
            )
            assert refused.code == 1 and refused.out.startswith("401")

            deleted = await agentfn("webhooks", "delete", endpoint_id, env=cli_env)
            assert (deleted.code, deleted.out) == (0, f"deleted {endpoint_id}\n")
            gone = await agentfn("webhooks", "test", endpoint_id, env=cli_env)
            assert gone.code == 1 and "No webhook endpoint found" in gone.err
            assert (await agentfn("webhooks", "list", env=cli_env)).out == "no webhook endpoints\n"
        assert "Traceback" not in app.log()
