"""One exception tree for everything agentfn-asgi raises.

Every error the package raises on purpose derives from :class:`AgentFnError`, so a host can
catch the whole family with one ``except``. Third-party errors (httpx, pydantic, drivers) are
translated at the boundary with ``raise ... from exc``. Every warning derives from
:class:`AgentFnWarning`, so one filter silences or escalates them all.

::

    AgentFnError
    ├── ConfigurationError              bad setup: missing secret, bad store URL, missing extra
    ├── CLIError                        a command of ``agentfn-asgi`` failed (exit code 1)
    │   └── CLIUsageError               the command was used wrongly (exit code 2)
    ├── DemoError                       the demo, or an example it started, misbehaved
    ├── ToolDefinitionError             refused at registration: name, signature, duplicates,
    │                                   definitions over the API's 3 MiB limit
    ├── ToolError                       raised by a handler; its text goes to the model as written
    ├── RetryLater                      raised by a handler: try this call again in ``after`` s
    ├── ArgumentValidationError         arguments do not match the tool's schema (model-safe text)
    ├── ResultError                     a handler's return value cannot be sent
    │   ├── ResultEncodingError         not JSON-serialisable (NaN, bytes, arbitrary objects)
    │   └── ResultTooLargeError         the serialised event exceeds the size budget
    ├── WebhookVerificationError        a delivery is malformed or not authentic
    │   ├── WebhookHeaderError          missing or malformed webhook-* header       → 400
    │   ├── WebhookSignatureError       no signature matched any secret             → 401
    │   └── WebhookTimestampError       timestamp outside the tolerance window      → 401
    ├── StoreError                      the durable store failed
    │   ├── StoreUnavailableError       cannot reach the store now (webhook answers 503)
    │   └── StoreRefusedError           the store refuses a value: retrying never succeeds
    ├── CompletionTokenError            a worker's completion token is refused      → 401
    │   ├── CompletionTokenExpiredError the token was authentic but has expired     → 401
    │   └── CompletionMismatchError     it names another tool than its call (also a
    │                                   LookupError)                                → 401
    ├── OperatorError                   an operator's request (CLI, page, Operator) cannot be
    │   │                               done as asked
    │   ├── CallNotFoundError           no such call in the store (also a LookupError) → 404
    │   ├── OperatorInputError          an ambiguous call id, a cursor or duration not
    │   │                               understood, settle asked wrongly (also a
    │   │                               ValueError)                                 → 400
    │   └── ApprovalError               a decision on an approval request was refused
    │       ├── ApprovalNotFoundError   no such request in the store               (exit 1)
    │       └── ApprovalDecidedError    decided already, or the call stopped waiting
    │           └── ApprovalExpiredError  it expired first: the call failed saying so
    └── APIError                        talking to the Agents API failed
        ├── SessionNotFoundYetError     a session whose webhook just arrived is not found
        │                               (yet): the sweep reads it again within the grace
        ├── APIConnectionError          no HTTP response (connect/read error)
        │   └── APITimeoutError         the request or the total deadline timed out
        └── APIStatusError              a non-2xx response (status, code, message, param,
            │                           request_id)
            ├── BadRequestError         400
            │   └── UnknownPendingToolCallError  400 "Unknown pending tool call: <id>"
            ├── AuthenticationError     401
            ├── PermissionDeniedError   403
            ├── NotFoundError           404
            ├── ConflictError           409
            ├── RateLimitError          429
            └── InternalServerError     5xx

    AgentFnWarning                      something works, but not the way you probably meant
    └── ToolDefinitionWarning           a tool registered, but the model gets no guidance for a
                                        parameter, or an in-doubt call has no reconcile hook
"""

from __future__ import annotations

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "AgentFnError",
    "AgentFnWarning",
    "ApprovalDecidedError",
    "ApprovalError",
    "ApprovalExpiredError",
    "ApprovalNotFoundError",
    "ArgumentValidationError",
    "AuthenticationError",
    "BadRequestError",
    "CLIError",
    "CLIUsageError",
    "CallNotFoundError",
    "CompletionMismatchError",
    "CompletionTokenError",
    "CompletionTokenExpiredError",
    "ConfigurationError",
    "ConflictError",
    "DemoError",
    "InternalServerError",
    "NotFoundError",
    "OperatorError",
    "OperatorInputError",
    "PermissionDeniedError",
    "RateLimitError",
    "ResultEncodingError",
    "ResultError",
    "ResultTooLargeError",
    "RetryLater",
    "SessionNotFoundYetError",
    "StoreError",
    "StoreRefusedError",
    "StoreUnavailableError",
    "ToolDefinitionError",
    "ToolDefinitionWarning",
    "ToolError",
    "UnknownPendingToolCallError",
    "WebhookHeaderError",
    "WebhookSignatureError",
    "WebhookTimestampError",
    "WebhookVerificationError",
]


class AgentFnError(Exception):
    """Base class of every error agentfn-asgi raises on purpose."""


class ConfigurationError(AgentFnError):
    """The package was set up wrongly (missing secret, bad URL, optional extra not installed)."""


class CLIError(AgentFnError):
    """An operational failure of the command line, reported on stderr with exit code 1 (a
    :class:`ConfigurationError` or :class:`CLIUsageError` exits with 2)."""


class CLIUsageError(CLIError):
    """A command of ``agentfn-asgi`` was used wrongly (an argument names something that is not
    what it should be); reported on stderr with exit code 2, as argparse's own usage errors."""


class DemoError(AgentFnError):
    """The demo (or an example it started) did not behave as scripted."""


class ToolDefinitionError(AgentFnError):
    """A tool was refused at registration time, never at call time."""


class AgentFnWarning(Warning):
    """Base class of every warning agentfn-asgi emits: the setup works, but probably not the
    way it was meant to. ``warnings.simplefilter("error", AgentFnWarning)`` makes them fatal."""


class ToolDefinitionWarning(AgentFnWarning, UserWarning):
    """A tool registered, but something about it will hurt later: a parameter whose schema
    tells the model nothing, or a side-effect tool with no reconcile hook. The message says
    how to fix it; :meth:`~agentfn_asgi.tools.FunctionTools.problems` lists the same findings.
    """


class ToolError(AgentFnError):
    """Raise from a handler to fail the call with a message the model sees as written.

    Use it for expected failures the model can act on ("order 42 is already refunded").
    Any other exception is reported to the model as a fixed, safe message instead, because
    exception text may contain secrets.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RetryLater(AgentFnError):  # noqa: N818 - a request to the dispatcher, not a failure
    """Raise from a handler (of any tool, side-effect tools included) to have the call tried
    again ``after`` seconds from now, e.g. on a downstream 429 with ``Retry-After``.

    Raise it only when this attempt changed nothing. The next attempt's time is kept in the
    store: a restart or another replica starts it then, never sooner and never twice. The
    attempts are bounded by the tool's ``retry=`` policy (its ``attempts`` and ``deadline``),
    or by its ``max_attempts`` without one; past the bound the model gets a failure saying
    the call was retried. ``reason`` (never shown to the model) goes to the call's history.
    """

    def __init__(self, after: float, reason: str = "") -> None:
        if not isinstance(after, int | float) or isinstance(after, bool) or not after >= 0:
            raise ValueError(f"RetryLater(after=...) takes seconds >= 0, not {after!r}")
        super().__init__(f"retry in {after:g} s" + (f": {reason}" if reason else ""))
        self.after = float(after)
        self.reason = reason


class ArgumentValidationError(AgentFnError):
    """The model's arguments do not match the tool's schema.

    ``message`` names field paths and expected types only, never the submitted values, so it
    is safe to show the model (which can then correct its call).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ResultError(AgentFnError):
    """A handler's return value cannot be turned into a ``tool_result`` event."""


class ResultEncodingError(ResultError):
    """The value is not JSON-serialisable (NaN, bytes, an arbitrary object...)."""


class ResultTooLargeError(ResultError):
    """The serialised ``tool_result`` event is larger than the allowed budget."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"tool result is {size} bytes, over the {limit}-byte limit")
        self.size = size
        self.limit = limit


class WebhookVerificationError(AgentFnError):
    """A webhook delivery is malformed or not authentic. ``status_code`` is the HTTP answer."""

    status_code: int = 400


class WebhookHeaderError(WebhookVerificationError):
    """A ``webhook-*`` header is missing or malformed."""

    status_code = 400


class WebhookSignatureError(WebhookVerificationError):
    """No ``v1`` signature in the header matches any configured secret."""

    status_code = 401


class WebhookTimestampError(WebhookVerificationError):
    """The ``webhook-timestamp`` is outside the tolerance window (too old or too new)."""

    status_code = 401


class StoreError(AgentFnError):
    """The durable store failed."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached right now; callers should back off and retry."""


class StoreRefusedError(StoreError):
    """The store refuses a value it was given (too large for its keys, a character it
    cannot hold): the same write never succeeds, so its call fails instead of being retried."""


class CompletionTokenError(AgentFnError):
    """A worker's completion token is forged, tampered with, or bound to another call."""


class CompletionTokenExpiredError(CompletionTokenError):
    """A completion token was authentic but is past its lifetime."""


class CompletionMismatchError(CompletionTokenError, LookupError):
    """An authentic completion names another tool than the call it is for: refused like a
    token bound to another call. Also a ``LookupError``."""


class OperatorError(AgentFnError):
    """An operator's request (``agentfn-asgi calls``, the operator page,
    :class:`~agentfn_asgi.operator.Operator`) cannot be done as asked; the message says why."""


class CallNotFoundError(OperatorError, LookupError):
    """No call of that id (in that session) is in the store. Also a ``LookupError``, as a
    missing key is (the page answers 404)."""


class OperatorInputError(OperatorError, ValueError):
    """An operator's input is not understood: a call id that names calls of several
    sessions (give the session), a listing cursor that is not ours, a duration not in the
    ``15m``/``2h``/``3d`` form, a settle with not exactly one of output, error or re-run.
    Also a ``ValueError`` (the page answers 400; the CLI names the fix)."""


class ApprovalError(OperatorError):
    """A decision on an approval request was refused (``approve``/``deny``: the CLI's exit 1).
    ``approval_id`` names the request."""

    def __init__(self, message: str, *, approval_id: str) -> None:
        super().__init__(message)
        self.approval_id = approval_id


class ApprovalNotFoundError(ApprovalError):
    """No call in this store (and namespace) has an approval request with this id."""


class ApprovalDecidedError(ApprovalError):
    """The request was decided already (``decision``: ``approved``, ``denied`` or
    ``expired``), or the call stopped waiting (stale): a decision is taken once."""

    def __init__(self, message: str, *, approval_id: str, decision: str | None) -> None:
        super().__init__(message, approval_id=approval_id)
        self.decision = decision


class ApprovalExpiredError(ApprovalDecidedError):
    """The request expired before this decision: the call fails, saying nobody approved it
    in time."""


class APIError(AgentFnError):
    """A request to the Agents API failed.

    Attributes mirror the API's error body (wire protocol §10.1): ``status`` (None when no
    response arrived), ``code``, ``message``, ``param``, ``type`` and ``request_id`` (from
    ``x-request-id``).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,  # mirrors the wire field name
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.param = param
        self.type = type
        self.request_id = request_id

    def __str__(self) -> str:
        parts = [self.message]
        if self.status is not None:
            parts.append(f"status={self.status}")
        if self.code:
            parts.append(f"code={self.code}")
        if self.param:
            parts.append(f"param={self.param}")
        if self.request_id:
            parts.append(f"request_id={self.request_id}")
        return " ".join(parts)


class SessionNotFoundYetError(APIError):
    """The API does not find a session whose webhook arrived less than ``not_found_grace``
    ago (a webhook may outrun the session becoming readable): its delivery stays unresolved
    and the recovery sweep reads the session again."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id} not found (yet); the sweep reads it again")
        self.session_id = session_id


class APIConnectionError(APIError):
    """No HTTP response arrived (connection refused, reset, protocol error)."""


class APITimeoutError(APIConnectionError):
    """A request, or the client's total deadline for it, timed out."""


class APIStatusError(APIError):
    """The API answered with a non-2xx status."""


class BadRequestError(APIStatusError):
    """HTTP 400."""


class UnknownPendingToolCallError(BadRequestError):
    """HTTP 400 ``Unknown pending tool call: <call_id>`` persisted after the short race retries.

    Either the call is not registered yet (the registration race) or it is no longer pending
    (answered, cancelled). Re-read the session: ``required_actions`` decides.
    """


class AuthenticationError(APIStatusError):
    """HTTP 401."""


class PermissionDeniedError(APIStatusError):
    """HTTP 403."""


class NotFoundError(APIStatusError):
    """HTTP 404."""


class ConflictError(APIStatusError):
    """HTTP 409."""


class RateLimitError(APIStatusError):
    """HTTP 429."""


class InternalServerError(APIStatusError):
    """HTTP 5xx."""
