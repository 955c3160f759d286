"""``agentfn-asgi webhooks``: the project's webhook endpoints from the terminal.

``create`` registers the app's URL and prints its signing secret once, as the line to put in
the app's environment (``OPENAI_WEBHOOK_SECRET=whsec_...``); ``list``, ``show``, ``update``
and ``delete`` manage endpoints; ``rotate-secret`` prints the new secret (with
``--keep-old``, the value of ``OPENAI_WEBHOOK_SECRET`` holding the new and the current one
for the 24 hours the API signs with both); ``test`` has the API send a signed sample and
prints the status the endpoint answered.

The calls go through :class:`~agentfn_asgi.client.AgentsClient` with the app's settings
(``OPENAI_API_KEY``, ``OPENAI_BASE_URL``, ``OPENAI_PROJECT_ID``: endpoints belong to the key's
project). The API key is never printed; the signing secret only by ``create`` and
``rotate-secret``, which exist to show it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import difflib
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..client import AgentsClient
from ..config import Config
from ..errors import APIError, APIStatusError, CLIError, CLIUsageError
from ..integrations.starlette import not_found_hint
from ..wire import WebhookEndpoint, WebhookEndpointWithSecret
from .common import EXIT_FAILURE, EXIT_OK, api_client, progress, show, stamp, table

__all__ = ["DEFAULT_EVENTS", "format_endpoint", "format_endpoints", "register"]

#: What ``create`` subscribes to without ``--events``: the events the app acts on (a call
#: owed; a turn ended, which stops the calls it no longer owes: docs/cancellation.md).
DEFAULT_EVENTS: tuple[str, ...] = (
    "agent.session.action_required",
    "agent.session.idle",
    "agent.session.failed",
)
_SECRET_VAR = "OPENAI_WEBHOOK_SECRET"  # noqa: S105 - the variable's name, not a secret
_KEY_LIKE = re.compile(r"\bsk-[A-Za-z0-9_*.-]+")

_T = TypeVar("_T")


# -- formatting ------------------------------------------------------------------------------


def _stamp(at: int | None) -> str:
    return "-" if at is None else f"{stamp(at)} UTC"


def format_endpoints(endpoints: Sequence[WebhookEndpoint]) -> str:
    """One line per endpoint: id, name, URL, event types."""
    if not endpoints:
        return "no webhook endpoints"
    header = ("ID", "NAME", "URL", "EVENTS")
    rows = [(e.id, e.name, e.url, ",".join(e.event_types)) for e in endpoints]
    return table(header, rows)


def format_endpoint(endpoint: WebhookEndpoint) -> str:
    """One endpoint, a field per line (never its secret: only a masked hint)."""
    rows = [
        ("id", endpoint.id),
        ("name", endpoint.name),
        ("url", endpoint.url),
        ("events", ", ".join(endpoint.event_types) or "-"),
        ("secret", endpoint.signing_secret_hint or "-"),
        ("created", _stamp(endpoint.created_at)),
        ("updated", _stamp(endpoint.updated_at)),
    ]
    return "\n".join(f"{label:<8}  {value}" for label, value in rows)


def _public(endpoint: WebhookEndpoint) -> dict[str, Any]:
    """The endpoint as JSON, without a secret even when the API sent one."""
    document = endpoint.model_dump(mode="json")
    document.pop("signing_secret", None)
    return document


# -- plumbing --------------------------------------------------------------------------------


def _run(work: Callable[[AgentsClient], Awaitable[_T]], why: str) -> _T:
    """Run ``work`` with the configured client; API failures become one line (exit 1),
    a malformed id a usage error (exit 2). A key-like word in a message is masked."""

    async def go() -> _T:
        async with api_client(Config.from_env(), why) as client:
            return await work(client)

    try:
        return asyncio.run(go())
    except APIError as exc:
        raise CLIError(_KEY_LIKE.sub("sk-***", str(exc))) from None
    except ValueError as exc:
        raise CLIUsageError(str(exc)) from None


def _url(value: str) -> str:
    """argparse type of ``--url``: an absolute http(s) URL (the API wants https)."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(
            f"expected the app's webhook URL, e.g. https://example.com/openai/webhooks, "
            f"got {value!r}"
        )
    return value


async def _checked_events(client: AgentsClient, wanted: Sequence[str]) -> list[str]:
    """``wanted`` once each, each one the project can subscribe to (the API's live list);
    a typo is a usage error with the closest type."""
    try:
        known = (await client.list_webhook_event_types()).data
    except APIStatusError as exc:
        if exc.status == 404:  # a server without the list: let the endpoint call judge
            return list(dict.fromkeys(wanted))
        raise
    for kind in wanted:
        if kind not in known:
            close = difflib.get_close_matches(kind, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise CLIUsageError(
                f"unknown event type {kind!r}{hint}; the project's types: {', '.join(known)}"
            )
    return list(dict.fromkeys(wanted))


def _secret_lines(secret: str, also: Sequence[str] = ()) -> str:
    value = ",".join(dict.fromkeys([secret, *also]))
    return f"{_SECRET_VAR}={value}"


# -- commands --------------------------------------------------------------------------------


def _create(args: argparse.Namespace) -> int:
    name = args.name or f"agentfn-asgi {urlsplit(args.url).netloc}"

    async def work(client: AgentsClient) -> WebhookEndpointWithSecret:
        events = await _checked_events(client, args.events or DEFAULT_EVENTS)
        return await client.create_webhook_endpoint(url=args.url, name=name, event_types=events)

    created = _run(work, "webhook endpoints are managed through the API")
    if args.json:
        print(json.dumps(created.model_dump(mode="json"), indent=2))
        return EXIT_OK
    progress(
        f"created {created.id} ({created.name}) for {created.url}: {', '.join(created.event_types)}"
    )
    progress(
        "its signing secret, shown this once: set it in the app's environment "
        "(a rotation prints a new one: agentfn-asgi webhooks rotate-secret "
        f"{created.id} --keep-old)"
    )
    print(_secret_lines(created.signing_secret))
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    async def work(client: AgentsClient) -> list[WebhookEndpoint]:
        found: list[WebhookEndpoint] = []
        after: str | None = None
        while True:
            page = await client.list_webhook_endpoints(limit=100, after=after)
            found += page.data
            if not page.has_more or not page.last_id:
                return found
            after = page.last_id

    endpoints = _run(work, "listing webhook endpoints")
    if args.json:
        print(json.dumps([_public(e) for e in endpoints], indent=2))
    else:
        show(format_endpoints(endpoints))
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    endpoint = _run(
        lambda client: client.retrieve_webhook_endpoint(args.endpoint_id),
        "reading a webhook endpoint",
    )
    show(json.dumps(_public(endpoint), indent=2) if args.json else format_endpoint(endpoint))
    return EXIT_OK


def _update(args: argparse.Namespace) -> int:
    if args.url is None and args.name is None and not args.events:
        raise CLIUsageError("nothing to change: give --url, --name or --events")

    async def work(client: AgentsClient) -> WebhookEndpoint:
        events = await _checked_events(client, args.events) if args.events else None
        return await client.update_webhook_endpoint(
            args.endpoint_id, url=args.url, name=args.name, event_types=events
        )

    endpoint = _run(work, "updating a webhook endpoint")
    show(json.dumps(_public(endpoint), indent=2) if args.json else format_endpoint(endpoint))
    return EXIT_OK


def _delete(args: argparse.Namespace) -> int:
    deleted = _run(
        lambda client: client.delete_webhook_endpoint(args.endpoint_id),
        "deleting a webhook endpoint",
    )
    print(f"deleted {deleted.id}" if deleted.deleted else f"{deleted.id} was not deleted")
    return EXIT_OK if deleted.deleted else EXIT_FAILURE


def _rotate(args: argparse.Namespace) -> int:
    rotated = _run(
        lambda client: client.rotate_webhook_secret(
            args.endpoint_id, keep_old_secret_active_for_24_hours=args.keep_old
        ),
        "rotating a webhook secret",
    )
    if args.json:
        print(json.dumps(rotated.model_dump(mode="json"), indent=2))
        return EXIT_OK
    new = rotated.signing_secret
    if not args.keep_old:
        progress(
            f"new signing secret of {rotated.id}; the old one no longer signs: set this "
            "in the app's environment and restart it"
        )
        print(_secret_lines(new))
        return EXIT_OK
    current = Config.from_env().webhook_secrets
    until = dt.datetime.now(dt.UTC) + dt.timedelta(hours=24)
    progress(
        f"new signing secret of {rotated.id}; the API signs with the new and the old one "
        f"until about {until:%Y-%m-%d %H:%M} UTC. Set both now, restart the app, and "
        f"after that {_SECRET_VAR}={new} alone:"
    )
    if current:
        print(_secret_lines(new, current))
    else:
        progress(f"({_SECRET_VAR} is not set here: add the endpoint's old secret after the comma)")
        print(f"{_SECRET_VAR}={new},<the old secret>")
    return EXIT_OK


def _test(args: argparse.Namespace) -> int:
    async def work(client: AgentsClient) -> tuple[str, int]:
        (event,) = await _checked_events(client, [args.event])
        result = await client.test_webhook_endpoint(args.endpoint_id, event_type=event)
        return result.event_type, result.status_code

    event, status = _run(work, "testing a webhook endpoint")
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    print(f"{status} {phrase}".rstrip())
    if 200 <= status < 300:
        progress(f"the endpoint took the {event} sample")
        return EXIT_OK
    progress(f"the endpoint refused the {event} sample: {_HINTS.get(status, _OTHER)}")
    return EXIT_FAILURE


_HINTS = {
    400: "not read as a webhook: is the URL the app's webhook route?",
    401: (
        f"the signature did not verify: is {_SECRET_VAR} in the app's environment this "
        "endpoint's secret (after a rotation, both secrets)?"
    ),
    404: not_found_hint(),
    405: "that path does not take POST: check the URL",
}
_OTHER = "a webhook sender counts anything but 2xx as a failure (redirects too)"


def register(sub: Any) -> None:
    """Add ``webhooks`` and its subcommands."""
    webhooks = sub.add_parser(
        "webhooks",
        help="create, list, update, delete, rotate and test the project's webhook endpoints",
        description=(
            "The project's webhook endpoints through the API (OPENAI_API_KEY, "
            "OPENAI_BASE_URL, OPENAI_PROJECT_ID). create and rotate-secret print the signing "
            "secret as the line to set in the app's environment; test has the API send a "
            "signed sample and prints what the endpoint answered."
        ),
    )
    which = webhooks.add_subparsers(dest="webhooks_command", metavar="SUBCOMMAND", required=True)

    create = which.add_parser(
        "create",
        help="register the app's webhook URL; prints its signing secret once",
        description=(
            "Create an endpoint for URL (the API takes https:// URLs) and print "
            f"{_SECRET_VAR}=whsec_... on stdout: the secret is shown only now."
        ),
    )
    create.add_argument("--url", required=True, type=_url, help="the app's webhook URL")
    create.add_argument("--name", help="a name to tell it apart (default: agentfn-asgi HOST)")
    create.add_argument(
        "--events",
        nargs="+",
        metavar="TYPE",
        help=f"event types to subscribe to (default {' '.join(DEFAULT_EVENTS)})",
    )
    create.add_argument("--json", action="store_true", help="the API's answer as JSON")
    create.set_defaults(handler=_create)

    listing = which.add_parser("list", help="the project's endpoints")
    listing.add_argument("--json", action="store_true", help="a JSON array of objects")
    listing.set_defaults(handler=_list)

    show = which.add_parser("show", help="one endpoint (its secret only as a masked hint)")
    show.add_argument("endpoint_id", metavar="ID")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(handler=_show)

    update = which.add_parser(
        "update",
        help="change an endpoint's URL, name or event types",
        description="--events replaces the whole set of event types.",
    )
    update.add_argument("endpoint_id", metavar="ID")
    update.add_argument("--url", type=_url, help="a new webhook URL")
    update.add_argument("--name", help="a new name")
    update.add_argument("--events", nargs="+", metavar="TYPE", help="the complete set of types")
    update.add_argument("--json", action="store_true", help="machine-readable output")
    update.set_defaults(handler=_update)

    delete = which.add_parser("delete", help="delete an endpoint (nothing is sent there after)")
    delete.add_argument("endpoint_id", metavar="ID")
    delete.set_defaults(handler=_delete)

    rotate = which.add_parser(
        "rotate-secret",
        help="replace an endpoint's signing secret; prints the new one",
        description=(
            "Without --keep-old the old secret stops signing at once. With it, the API signs "
            "each delivery with both for 24 hours, and the printed value of "
            f"{_SECRET_VAR} holds the new secret and the current one (read from "
            f"{_SECRET_VAR} here): the app accepts either until you drop the old one."
        ),
    )
    rotate.add_argument("endpoint_id", metavar="ID")
    rotate.add_argument(
        "--keep-old", action="store_true", help="keep the old secret signing for 24 hours"
    )
    rotate.add_argument("--json", action="store_true", help="the API's answer as JSON")
    rotate.set_defaults(handler=_rotate)

    test = which.add_parser(
        "test",
        help="have the API send a signed sample; print the status the endpoint answered",
        description="Exit 0 when the endpoint answered 2xx, 1 otherwise (with a hint).",
    )
    test.add_argument("endpoint_id", metavar="ID")
    test.add_argument(
        "--event",
        default=DEFAULT_EVENTS[0],
        metavar="TYPE",
        help=f"the sample's event type (default {DEFAULT_EVENTS[0]})",
    )
    test.set_defaults(handler=_test)
