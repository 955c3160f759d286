"""agentfn-asgi: run function tools for OpenAI's Agents API from signed webhooks.

Mount :class:`AgentWebhookApp` in your ASGI service, register handlers on a
:class:`FunctionTools` registry, and give the agent ``tools.definitions()``.

The documentation is the repository's ``docs/`` folder (a site built with ``make docs``).
Docstrings cite two of its pages: "wire protocol §N" is a section of
``docs/how-it-works/wire-protocol.md`` (the Agents API as the package relies on it), and
"architecture step N" a step of ``docs/how-it-works/architecture.md`` (one delivery, end to
end).
"""

from __future__ import annotations

from agentfn_asgi._version import __version__
from agentfn_asgi.actions import (
    ActionRequest,
    ActionRules,
    EnvironmentConnection,
    MCPRequest,
    OriginRequest,
    SignIn,
    SignInRequest,
)
from agentfn_asgi.app import AgentWebhookApp
from agentfn_asgi.client import AgentsClient, RetryEvent
from agentfn_asgi.config import Config
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.errors import (
    AgentFnError,
    AgentFnWarning,
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    ApprovalDecidedError,
    ApprovalError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    ArgumentValidationError,
    AuthenticationError,
    BadRequestError,
    CallNotFoundError,
    CLIError,
    CLIUsageError,
    CompletionMismatchError,
    CompletionTokenError,
    CompletionTokenExpiredError,
    ConfigurationError,
    ConflictError,
    DemoError,
    InternalServerError,
    NotFoundError,
    OperatorError,
    OperatorInputError,
    PermissionDeniedError,
    RateLimitError,
    ResultEncodingError,
    ResultError,
    ResultTooLargeError,
    RetryLater,
    SessionNotFoundYetError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
    ToolDefinitionError,
    ToolDefinitionWarning,
    ToolError,
    UnknownPendingToolCallError,
    WebhookHeaderError,
    WebhookSignatureError,
    WebhookTimestampError,
    WebhookVerificationError,
)
from agentfn_asgi.policy import RetryPolicy
from agentfn_asgi.results import ImagePart, TextPart, image_from_bytes, image_part, text_part
from agentfn_asgi.signing import VerifiedDelivery, WebhookVerifier, sign, signed_headers
from agentfn_asgi.store import Store, open_store
from agentfn_asgi.stream import FollowSummary
from agentfn_asgi.tools import (
    Cancellation,
    FunctionTool,
    FunctionTools,
    NotRun,
    Ran,
    ToolContext,
    Unknown,
)
from agentfn_asgi.tracing import Telemetry, trace_id_for_call

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "ActionRequest",
    "ActionRules",
    "AgentFnError",
    "AgentFnWarning",
    "AgentWebhookApp",
    "AgentsClient",
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
    "Cancellation",
    "CompletionMismatchError",
    "CompletionTokenError",
    "CompletionTokenExpiredError",
    "Config",
    "ConfigurationError",
    "ConflictError",
    "DemoError",
    "DispatchSettings",
    "EnvironmentConnection",
    "FollowSummary",
    "FunctionTool",
    "FunctionTools",
    "ImagePart",
    "InternalServerError",
    "MCPRequest",
    "NotFoundError",
    "NotRun",
    "OperatorError",
    "OperatorInputError",
    "OriginRequest",
    "PermissionDeniedError",
    "Ran",
    "RateLimitError",
    "ResultEncodingError",
    "ResultError",
    "ResultTooLargeError",
    "RetryEvent",
    "RetryLater",
    "RetryPolicy",
    "SessionNotFoundYetError",
    "SignIn",
    "SignInRequest",
    "Store",
    "StoreError",
    "StoreRefusedError",
    "StoreUnavailableError",
    "Telemetry",
    "TextPart",
    "ToolContext",
    "ToolDefinitionError",
    "ToolDefinitionWarning",
    "ToolError",
    "Unknown",
    "UnknownPendingToolCallError",
    "VerifiedDelivery",
    "WebhookHeaderError",
    "WebhookSignatureError",
    "WebhookTimestampError",
    "WebhookVerificationError",
    "WebhookVerifier",
    "__version__",
    "image_from_bytes",
    "image_part",
    "open_store",
    "sign",
    "signed_headers",
    "text_part",
    "trace_id_for_call",
]
