"""Tests for agentfn_asgi.signing: Standard Webhooks v1, stricter than the reference libraries."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.webhooks import AgentSessionActionRequiredWebhookEvent
from starlette.datastructures import Headers

from agentfn_asgi import signing
from agentfn_asgi.errors import (
    ConfigurationError,
    WebhookHeaderError,
    WebhookSignatureError,
    WebhookTimestampError,
    WebhookVerificationError,
)
from agentfn_asgi.signing import (
    VerifiedDelivery,
    WebhookVerifier,
    parse_secrets,
    sign,
    signed_headers,
)

NOW = 1_750_000_000
SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"old-key-" * 4).decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"not-the-key-" * 3).decode()
BODY = (
    b'{"id":"evt_1","object":"event","created_at":1750000000,'
    b'"type":"agent.session.action_required",'
    b'"data":{"id":"sess_1","required_action":{"type":"function_call"}}}'
)
MSG_ID = "wh_685c059ae39c8190af8c71ed1022a24d"

# peers.md §2.5: (secret, msg id, timestamp, payload, expected signature).
VECTORS = [
    pytest.param(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330,
        b'{"test": 2432232314}',
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        id="standard-webhooks",
    ),
    pytest.param(
        "whsec_RdvaYFYUXuIFuEbvZHwMfYFhUf7aMYjYcmM24+Aj40c=",
        "wh_685c059ae39c8190af8c71ed1022a24d",
        1750861210,
        b'{"id": "evt_685c059ae3a481909bdc86819b066fb6", "object": "event", "created_at": '
        b'1750861210, "type": "response.completed", "data": {"id": "resp_123"}}',
        "v1,gUAg4R2hWouRZqRQG4uJypNS8YK885G838+EHb4nKBY=",
        id="openai",
    ),
]


def fixed_clock(now: float = NOW) -> Callable[[], float]:
    """A clock frozen at ``now``."""
    return lambda: now


def raw_signature(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    """Sign arbitrary header strings (even ones the verifier must refuse) the spec's way."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = msg_id.encode("utf-8", "surrogatepass") + b"." + timestamp.encode("utf-8") + b"."
    digest = hmac.new(key, signed + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def delivery_headers(
    *, msg_id: str = MSG_ID, timestamp: int = NOW, body: bytes = BODY, secret: str = SECRET
) -> dict[str, str]:
    """Headers of a valid delivery of ``body`` signed with ``secret``."""
    return signed_headers(secret, body, msg_id=msg_id, timestamp=timestamp)


@pytest.mark.parametrize(("secret", "msg_id", "timestamp", "body", "expected"), VECTORS)
def test_conformance_vectors(
    secret: str, msg_id: str, timestamp: int, body: bytes, expected: str
) -> None:
    """Both published vectors sign to the published value and verify at their timestamp."""
    assert sign(secret, msg_id, timestamp, body) == expected
    verifier = WebhookVerifier(secret, clock=fixed_clock(timestamp))
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": expected,
    }
    assert verifier.verify(body, headers) == VerifiedDelivery(msg_id, timestamp, 0)


def test_signed_headers_defaults() -> None:
    """signed_headers picks a random msg_ id and the clock's second, and verifies."""
    headers = signed_headers(SECRET, BODY, clock=fixed_clock(NOW + 0.75))
    assert set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert headers["webhook-id"].startswith("msg_")
    assert len(headers["webhook-id"]) == 4 + 24
    assert headers["webhook-timestamp"] == str(NOW)
    assert signed_headers(SECRET, BODY)["webhook-id"] != headers["webhook-id"]
    delivery = WebhookVerifier(SECRET, clock=fixed_clock()).verify(BODY, headers)
    assert delivery.msg_id == headers["webhook-id"]
    assert delivery.timestamp == NOW


def test_verified_delivery_is_frozen_and_slotted() -> None:
    """VerifiedDelivery is an immutable value without a __dict__."""
    delivery = VerifiedDelivery("msg_1", NOW, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        delivery.msg_id = "other"  # type: ignore[misc]
    assert not hasattr(delivery, "__dict__")


def test_public_names_sorted_and_complete() -> None:
    """__all__ is sorted and every name in it exists."""
    assert signing.__all__ == sorted(signing.__all__)
    for name in signing.__all__:
        assert hasattr(signing, name)


def test_rotation_either_secret_and_which_matched() -> None:
    """With old+new secrets, a signature by either verifies and secret_index says which."""
    verifier = WebhookVerifier([OLD_SECRET, SECRET], clock=fixed_clock())
    by_old = delivery_headers(secret=OLD_SECRET)
    by_new = delivery_headers(secret=SECRET)
    assert verifier.verify(BODY, by_old).secret_index == 0
    assert verifier.verify(BODY, by_new).secret_index == 1
    both = signed_headers([OLD_SECRET, SECRET], BODY, msg_id=MSG_ID, timestamp=NOW)
    assert len(both["webhook-signature"].split(" ")) == 2
    assert verifier.verify(BODY, both).secret_index == 0
    assert WebhookVerifier(SECRET, clock=fixed_clock()).verify(BODY, both).secret_index == 0


def test_rotation_from_env_style_string() -> None:
    """A comma/space separated string (OPENAI_WEBHOOK_SECRET) configures several secrets."""
    verifier = WebhookVerifier(f" {OLD_SECRET} ,\n{SECRET}, ", clock=fixed_clock())
    assert verifier.verify(BODY, delivery_headers(secret=SECRET)).secret_index == 1


def test_one_valid_entry_among_noise() -> None:
    """A valid v1 entry verifies among v2/v1a/bare/invalid v1 entries, in any position."""
    good = sign(SECRET, MSG_ID, NOW, BODY)
    bad = sign(OTHER_SECRET, MSG_ID, NOW, BODY)
    noise = [
        "v2," + good[3:],
        "v1a," + good[3:],
        bad,
        "v1,notbase64!!",
        good[3:],
        "v1,AAAA",
    ]
    verifier = WebhookVerifier(SECRET, clock=fixed_clock())
    for position in range(len(noise) + 1):
        entries = [*noise[:position], good, *noise[position:]]
        headers = delivery_headers() | {"webhook-signature": " ".join(entries)}
        assert verifier.verify(BODY, headers) == VerifiedDelivery(MSG_ID, NOW, 0)
    only_noise = delivery_headers() | {"webhook-signature": " ".join(noise)}
    with pytest.raises(WebhookSignatureError):
        verifier.verify(BODY, only_noise)


def test_unprefixed_and_foreign_versions_never_compared() -> None:
    """A correct MAC without the v1 prefix (which openai's lib accepts) or as v1a/v2 fails."""
    good = sign(SECRET, MSG_ID, NOW, BODY)
    verifier = WebhookVerifier(SECRET, clock=fixed_clock())
    for value in (good[3:], "v1a," + good[3:], "v2," + good[3:], "V1," + good[3:]):
        with pytest.raises(WebhookSignatureError):
            verifier.verify(BODY, delivery_headers() | {"webhook-signature": value})


@pytest.mark.parametrize(
    ("offset", "accepted"),
    [(-300, True), (300, True), (0, True), (-301, False), (301, False), (-(10**6), False)],
)
def test_default_tolerance_boundary(offset: int, accepted: bool) -> None:
    """The default window is ±300 s inclusive; 301 s either way is refused."""
    verifier = WebhookVerifier(SECRET, clock=fixed_clock())
    headers = delivery_headers(timestamp=NOW + offset)
    if accepted:
        assert verifier.verify(BODY, headers).timestamp == NOW + offset
    else:
        with pytest.raises(WebhookTimestampError):
            verifier.verify(BODY, headers)


def test_timestamp_error_says_old_or_new() -> None:
    """Too-old and too-new deliveries are both WebhookTimestampError, with distinct text."""
    verifier = WebhookVerifier(SECRET, clock=fixed_clock())
    with pytest.raises(WebhookTimestampError, match="too old"):
        verifier.verify(BODY, delivery_headers(timestamp=NOW - 400))
    with pytest.raises(WebhookTimestampError, match="too new"):
        verifier.verify(BODY, delivery_headers(timestamp=NOW + 400))


def test_custom_tolerance() -> None:
    """A custom tolerance moves both edges; zero accepts only the clock's own second."""
    wide = WebhookVerifier(SECRET, tolerance=600, clock=fixed_clock())
    assert wide.tolerance == 600.0
    for offset in (-600, -400, 400, 600):
        wide.verify(BODY, delivery_headers(timestamp=NOW + offset))
    for offset in (-601, 601):
        with pytest.raises(WebhookTimestampError):
            wide.verify(BODY, delivery_headers(timestamp=NOW + offset))
    exact = WebhookVerifier(SECRET, tolerance=0, clock=fixed_clock(NOW + 0.999))
    exact.verify(BODY, delivery_headers(timestamp=NOW))
    for offset in (-1, 1):
        with pytest.raises(WebhookTimestampError):
            exact.verify(BODY, delivery_headers(timestamp=NOW + offset))


def test_clock_is_read_per_delivery() -> None:
    """The injected clock is consulted on every verify, so a delivery can age out."""
    now = [float(NOW)]
    verifier = WebhookVerifier(SECRET, clock=lambda: now[0])
    headers = delivery_headers()
    verifier.verify(BODY, headers)
    now[0] += 301
    with pytest.raises(WebhookTimestampError):
        verifier.verify(BODY, headers)


def test_timestamp_checked_before_signature() -> None:
    """A stale delivery is reported as stale even when its signature is also wrong."""
    verifier = WebhookVerifier(SECRET, clock=fixed_clock())
    headers = delivery_headers(timestamp=NOW - 1000, secret=OTHER_SECRET)
    with pytest.raises(WebhookTimestampError):
        verifier.verify(BODY, headers)


def test_header_names_case_insensitive() -> None:
    """Header names match in any case, in a plain dict and in starlette's Headers."""
    verifier = WebhookVerifier(SECRET, clock=fixed_clock())
    headers = delivery_headers()
    mixed = {
        "Webhook-Id": headers["webhook-id"],
        "WEBHOOK-TIMESTAMP": headers["webhook-timestamp"],
        "webhook-Signature": headers["webhook-signature"],
        "Content-Type": "application/json",
    }
    assert verifier.verify(BODY, mixed).msg_id == MSG_ID
    raw = [(name.lower().encode(), value.encode()) for name, value in mixed.items()]
    assert verifier.verify(BODY, Headers(raw=raw)).msg_id == MSG_ID


def test_body_is_raw_bytes_never_decoded() -> None:
    """Non-UTF-8 bodies verify (openai's lib raises UnicodeDecodeError); str is refused."""
    body = b"\xff\xfe\x00\x80 not utf-8 \xc3\x28"
    verifier = WebhookVerifier(SECRET, clock=fixed_clock())
    verifier.verify(body, delivery_headers(body=body))
    with pytest.raises(TypeError, match="raw request bytes"):
        verifier.verify(BODY.decode(), delivery_headers())  # type: ignore[arg-type]


def test_reserialised_json_fails() -> None:
    """Verifying re-serialised JSON instead of the raw bytes fails (the spec's classic bug)."""
    verifier = WebhookVerifier(SECRET, clock=fixed_clock())
    reserialised = json.dumps(json.loads(BODY)).encode()
    assert reserialised != BODY
    with pytest.raises(WebhookSignatureError):
        verifier.verify(reserialised, delivery_headers())


def test_parse_secrets_splits_on_spaces_and_commas() -> None:
    """parse_secrets splits strings and sequence items on whitespace/commas, dropping blanks."""
    assert parse_secrets("") == ()
    assert parse_secrets("  , ") == ()
    assert parse_secrets("whsec_a") == ("whsec_a",)
    assert parse_secrets("whsec_a,whsec_b whsec_c ,\twhsec_d") == (
        "whsec_a",
        "whsec_b",
        "whsec_c",
        "whsec_d",
    )
    assert parse_secrets(["whsec_a", " whsec_b,whsec_c ", ""]) == ("whsec_a", "whsec_b", "whsec_c")
    with pytest.raises(ConfigurationError):
        parse_secrets(b"whsec_a")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        parse_secrets([b"whsec_a"])  # type: ignore[list-item]


def test_unprefixed_secret_refused_with_reason() -> None:
    """A secret without whsec_ is a ConfigurationError naming the OpenAI/Standard Webhooks split."""
    raw = SECRET.removeprefix("whsec_")
    with pytest.raises(ConfigurationError, match="whsec_") as info:
        WebhookVerifier(raw)
    message = str(info.value)
    assert "OpenAI" in message
    assert "Standard Webhooks" in message
    assert raw not in message
    with pytest.raises(ConfigurationError):
        sign(raw, MSG_ID, NOW, BODY)
    with pytest.raises(ConfigurationError):
        signed_headers([SECRET, raw], BODY)


@pytest.mark.parametrize(
    "secrets",
    [
        pytest.param("", id="empty-string"),
        pytest.param([], id="empty-list"),
        pytest.param(" , ", id="only-separators"),
        pytest.param("whsec_", id="empty-key"),
        pytest.param("whsec_====", id="only-padding"),
        pytest.param("whsec_abc!def", id="non-alphabet"),
        pytest.param("whsec_QUJD-RA", id="urlsafe-alphabet"),
        pytest.param("whsec_QUJDRA=", id="wrong-padding"),
        pytest.param("whsec_QUJDR", id="impossible-length"),
        pytest.param("whsec_QU=JD", id="padding-inside"),
        pytest.param("whsec_QUJDRA==QUJD", id="data-after-padding"),
        pytest.param("whsec_QUJDRAé=", id="non-ascii"),
        pytest.param("Whsec_QUJDRA==", id="prefix-case"),
    ],
)
def test_bad_secret_configuration(secrets: str | list[str]) -> None:
    """Empty or malformed secrets are refused at construction, never at verify time."""
    with pytest.raises(ConfigurationError):
        WebhookVerifier(secrets)
    with pytest.raises(ConfigurationError):
        signed_headers(secrets, BODY)


def test_unpadded_secret_equals_padded() -> None:
    """A whsec_ secret printed without base64 padding means the same key."""
    padded = "whsec_" + base64.b64encode(b"twenty-three-byte-key!!").decode()
    assert padded.endswith("=")
    unpadded = padded.rstrip("=")
    assert sign(unpadded, MSG_ID, NOW, BODY) == sign(padded, MSG_ID, NOW, BODY)
    WebhookVerifier(unpadded, clock=fixed_clock()).verify(BODY, delivery_headers(secret=padded))


@pytest.mark.parametrize("tolerance", [-1.0, float("nan"), float("inf")])
def test_bad_tolerance(tolerance: float) -> None:
    """Negative or non-finite tolerances are configuration errors."""
    with pytest.raises(ConfigurationError):
        WebhookVerifier(SECRET, tolerance=tolerance)


# -- garbage in: only WebhookVerificationError subclasses may come out ---------------------

SIGNED = object()  # sentinel: sign the row's own id/timestamp/body with SECRET
MISSING = object()  # sentinel: leave the header out
GOOD_B64 = sign(SECRET, MSG_ID, NOW, BODY)[3:]
STALE = str(NOW - 301)


def _noncanonical(b64: str) -> str:
    """The same 32 bytes spelled with non-zero padding bits in the last data character."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet[alphabet.index(b64[42]) ^ 1]
    return b64[:42] + last + "="


def test_noncanonical_signature_spelling_refused() -> None:
    """A MAC re-spelled with non-zero base64 padding bits decodes to the same bytes but fails."""
    respelled = _noncanonical(GOOD_B64)
    assert respelled != GOOD_B64
    assert base64.b64decode(respelled, validate=True) == base64.b64decode(GOOD_B64)
    verifier = WebhookVerifier(SECRET, clock=fixed_clock())
    verifier.verify(BODY, delivery_headers())
    with pytest.raises(WebhookSignatureError):
        verifier.verify(BODY, delivery_headers() | {"webhook-signature": "v1," + respelled})


def _b64(n: int) -> str:
    return base64.b64encode(bytes(n)).decode()


# Short names keep one row per line.
H, S, T = WebhookHeaderError, WebhookSignatureError, WebhookTimestampError
TS = str(NOW)
V1 = "v1," + GOOD_B64
WRONG_SECRET_SIG = sign(OTHER_SECRET, MSG_ID, NOW, BODY)

# (id, msg id, timestamp, signature, body, expected): None expected = must verify.
GARBAGE: list[tuple[str, object, object, object, bytes, type[Exception] | None]] = [
    ("baseline", MSG_ID, TS, SIGNED, BODY, None),
    # webhook-id
    ("id-missing", MISSING, TS, SIGNED, BODY, H),
    ("id-empty", "", TS, SIGNED, BODY, H),
    ("id-256", "m" * 256, TS, SIGNED, BODY, None),
    ("id-257", "m" * 257, TS, SIGNED, BODY, H),
    ("id-huge", "m" * 1_000_000, TS, SIGNED, BODY, H),
    ("id-space", "msg 1", TS, SIGNED, BODY, H),
    ("id-tab", "msg\t1", TS, SIGNED, BODY, H),
    ("id-newline", "msg\r\n1", TS, SIGNED, BODY, H),
    ("id-nul", "msg\x001", TS, SIGNED, BODY, H),
    ("id-del", "msg\x7f", TS, SIGNED, BODY, H),
    ("id-non-ascii", "msg_é", TS, SIGNED, BODY, H),
    ("id-latin1-mojibake", "msg_\xc3\xa9", TS, SIGNED, BODY, H),
    ("id-surrogate", "msg_\udc80", TS, SIGNED, BODY, H),
    ("id-bytes", b"msg_1", TS, V1, BODY, H),
    ("id-dots", "a.b.c", TS, SIGNED, BODY, None),
    # webhook-timestamp
    ("ts-missing", MSG_ID, MISSING, SIGNED, BODY, H),
    ("ts-empty", MSG_ID, "", SIGNED, BODY, H),
    ("ts-arabic-indic", MSG_ID, "١٢٣", SIGNED, BODY, H),
    ("ts-fullwidth", MSG_ID, "１７５００００００００", SIGNED, BODY, H),
    ("ts-superscript", MSG_ID, "²", SIGNED, BODY, H),
    ("ts-plus", MSG_ID, "+" + TS, SIGNED, BODY, H),
    ("ts-minus", MSG_ID, "-1", SIGNED, BODY, H),
    ("ts-leading-space", MSG_ID, " " + TS, SIGNED, BODY, H),
    ("ts-trailing-newline", MSG_ID, TS + "\n", SIGNED, BODY, H),
    ("ts-underscore", MSG_ID, "1_750_000_000", SIGNED, BODY, H),
    ("ts-float", MSG_ID, f"{NOW}.5", SIGNED, BODY, H),
    ("ts-exponent", MSG_ID, "1.75e9", SIGNED, BODY, H),
    ("ts-hex", MSG_ID, "0x684ee180", SIGNED, BODY, H),
    ("ts-13-digits", MSG_ID, "1" * 13, SIGNED, BODY, H),
    ("ts-huge", MSG_ID, "9" * 100_000, SIGNED, BODY, H),
    ("ts-12-digits", MSG_ID, "9" * 12, SIGNED, BODY, T),
    ("ts-zero", MSG_ID, "0", SIGNED, BODY, T),
    ("ts-leading-zero", MSG_ID, "0" + TS, SIGNED, BODY, None),
    ("ts-stale", MSG_ID, STALE, SIGNED, BODY, T),
    ("ts-future", MSG_ID, str(NOW + 301), SIGNED, BODY, T),
    ("ts-int", MSG_ID, NOW, V1, BODY, H),
    # webhook-signature
    ("sig-missing", MSG_ID, TS, MISSING, BODY, H),
    ("sig-empty", MSG_ID, TS, "", BODY, H),
    ("sig-spaces-only", MSG_ID, TS, "   ", BODY, S),
    ("sig-garbage", MSG_ID, TS, "garbage", BODY, S),
    ("sig-bare-valid", MSG_ID, TS, GOOD_B64, BODY, S),
    ("sig-v1-only", MSG_ID, TS, "v1", BODY, S),
    ("sig-v1-comma", MSG_ID, TS, "v1,", BODY, S),
    ("sig-v1-a-b", MSG_ID, TS, "v1,a,b", BODY, S),
    ("sig-not-base64", MSG_ID, TS, "v1,!!!notbase64", BODY, S),
    ("sig-31-bytes", MSG_ID, TS, "v1," + _b64(31), BODY, S),
    ("sig-33-bytes", MSG_ID, TS, "v1," + _b64(33), BODY, S),
    ("sig-64-bytes", MSG_ID, TS, "v1," + _b64(64), BODY, S),
    ("sig-unpadded", MSG_ID, TS, V1[:-1], BODY, S),
    ("sig-double-pad", MSG_ID, TS, V1 + "=", BODY, S),
    ("sig-pad-in-middle", MSG_ID, TS, "v1," + "A=" + GOOD_B64[2:], BODY, S),
    ("sig-noncanonical", MSG_ID, TS, "v1," + _noncanonical(GOOD_B64), BODY, S),
    ("sig-urlsafe-char", MSG_ID, TS, "v1,-" + GOOD_B64[1:], BODY, S),
    ("sig-v1-upper", MSG_ID, TS, "V1," + GOOD_B64, BODY, S),
    ("sig-v1a", MSG_ID, TS, "v1a," + GOOD_B64, BODY, S),
    ("sig-v2", MSG_ID, TS, "v2," + GOOD_B64, BODY, S),
    ("sig-space-padded", MSG_ID, TS, "  v1," + GOOD_B64 + "  ", BODY, None),
    ("sig-tab-separated", MSG_ID, TS, "v1,x\tv1," + GOOD_B64, BODY, H),
    ("sig-newline", MSG_ID, TS, V1 + "\n", BODY, H),
    ("sig-crlf-injection", MSG_ID, TS, "v1,x\r\nX-Evil: 1", BODY, H),
    ("sig-non-ascii", MSG_ID, TS, "v1,é" + GOOD_B64[1:], BODY, H),
    ("sig-nul", MSG_ID, TS, V1 + "\x00", BODY, H),
    ("sig-8k", MSG_ID, TS, V1 + " " * 8000, BODY, None),
    ("sig-over-8k", MSG_ID, TS, V1 + " " * 8200, BODY, H),
    ("sig-16-entries", MSG_ID, TS, "v2,x " * 15 + V1, BODY, None),
    ("sig-17-entries", MSG_ID, TS, "v2,x " * 16 + V1, BODY, H),
    ("sig-bytes", MSG_ID, TS, V1.encode(), BODY, H),
    ("sig-wrong-secret", MSG_ID, TS, WRONG_SECRET_SIG, BODY, S),
    ("sig-other-id", "wh_other", TS, V1, BODY, S),
    ("sig-other-ts", MSG_ID, str(NOW + 1), V1, BODY, S),
    # body
    ("body-empty", MSG_ID, TS, SIGNED, b"", None),
    ("body-non-utf8", MSG_ID, TS, SIGNED, b"\x80\xff\xfe{\xc3(", None),
    ("body-nul", MSG_ID, TS, SIGNED, b"\x00" * 64, None),
    ("body-large", MSG_ID, TS, SIGNED, b"x" * 1_000_000, None),
    ("body-flipped-byte", MSG_ID, TS, V1, BODY[:-1] + b"]", S),
    ("body-appended", MSG_ID, TS, V1, BODY + b"\n", S),
    ("body-truncated", MSG_ID, TS, V1, BODY[:-1], S),
    ("body-non-utf8-unsigned", MSG_ID, TS, V1, b"\xff" * 10, S),
]


@pytest.mark.parametrize(
    ("msg_id", "timestamp", "signature", "body", "expected"),
    [pytest.param(*row[1:], id=row[0]) for row in GARBAGE],
)
def test_garbage_in_only_verification_errors_out(
    msg_id: object,
    timestamp: object,
    signature: object,
    body: bytes,
    expected: type[Exception] | None,
) -> None:
    """Each malformed delivery raises exactly the named subclass; good ones still verify."""
    headers: dict[str, Any] = {}
    if msg_id is not MISSING:
        headers["webhook-id"] = msg_id
    if timestamp is not MISSING:
        headers["webhook-timestamp"] = timestamp
    if signature is SIGNED:
        signed_id = msg_id if isinstance(msg_id, str) else MSG_ID
        signed_ts = timestamp if isinstance(timestamp, str) else TS
        headers["webhook-signature"] = raw_signature(SECRET, signed_id, signed_ts, body)
    elif signature is not MISSING:
        headers["webhook-signature"] = signature
    verifier = WebhookVerifier(SECRET, clock=fixed_clock())
    if expected is None:
        delivery = verifier.verify(body, headers)
        assert delivery.msg_id == msg_id
        return
    with pytest.raises(WebhookVerificationError) as info:
        verifier.verify(body, headers)
    assert type(info.value) is expected
    assert info.value.status_code == (400 if expected is WebhookHeaderError else 401)


def test_error_messages_do_not_echo_header_values() -> None:
    """Error text names the header, never its (attacker-controlled) value."""
    verifier = WebhookVerifier(SECRET, clock=fixed_clock())
    marker = "INJECTED\x1b[31m"
    for name in ("webhook-id", "webhook-timestamp", "webhook-signature"):
        headers = delivery_headers() | {name: marker}
        with pytest.raises(WebhookVerificationError) as info:
            verifier.verify(BODY, headers)
        assert "INJECTED" not in str(info.value)


# -- properties ---------------------------------------------------------------------------

HEADER_NAMES = st.sampled_from(
    ["webhook-id", "Webhook-Id", "webhook-timestamp", "WEBHOOK-TIMESTAMP", "webhook-signature"]
)
TIMESTAMPS = st.one_of(
    st.text(max_size=20),
    st.integers(min_value=NOW - 400, max_value=NOW + 400).map(str),
)
SIGNATURES = st.one_of(
    st.text(max_size=200),
    st.lists(
        st.one_of(
            st.binary(min_size=30, max_size=34).map(
                lambda raw: "v1," + base64.b64encode(raw).decode()
            ),
            st.text(alphabet="v12a,=+/ABCxyz09", max_size=50),
        ),
        max_size=5,
    ).map(" ".join),
)


@settings(max_examples=300, deadline=None)
@given(
    extra=st.dictionaries(st.one_of(HEADER_NAMES, st.text(max_size=20)), st.text(max_size=50)),
    msg_id=st.one_of(st.none(), st.text(max_size=40)),
    timestamp=st.one_of(st.none(), TIMESTAMPS),
    signature=st.one_of(st.none(), SIGNATURES),
    body=st.binary(max_size=256),
)
def test_property_arbitrary_input_never_leaks_or_verifies(
    extra: dict[str, str],
    msg_id: str | None,
    timestamp: str | None,
    signature: str | None,
    body: bytes,
) -> None:
    """Arbitrary text headers and byte bodies only raise WebhookVerificationError subclasses
    and never verify without the secret."""
    headers = dict(extra)
    for name, value in (
        ("webhook-id", msg_id),
        ("webhook-timestamp", timestamp),
        ("webhook-signature", signature),
    ):
        if value is not None:
            headers[name] = value
    verifier = WebhookVerifier(SECRET, clock=fixed_clock())
    with pytest.raises(WebhookVerificationError) as info:
        verifier.verify(body, headers)
    assert type(info.value) in (WebhookHeaderError, WebhookSignatureError, WebhookTimestampError)


VALID_IDS = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=256
)


@settings(max_examples=200, deadline=None)
@given(
    msg_id=VALID_IDS,
    offset=st.integers(min_value=-300, max_value=300),
    body=st.binary(max_size=2048),
    flip=st.integers(min_value=0),
)
def test_property_round_trip_and_tamper(msg_id: str, offset: int, body: bytes, flip: int) -> None:
    """Any valid id, in-window timestamp and body round-trips; any changed body byte fails."""
    verifier = WebhookVerifier([OLD_SECRET, SECRET], clock=fixed_clock())
    headers = signed_headers(SECRET, body, msg_id=msg_id, timestamp=NOW + offset)
    assert verifier.verify(body, headers) == VerifiedDelivery(msg_id, NOW + offset, 1)
    if body:
        index = flip % len(body)
        tampered = body[:index] + bytes([body[index] ^ 0x01]) + body[index + 1 :]
        with pytest.raises(WebhookSignatureError):
            verifier.verify(tampered, headers)


# -- cross-check with the official openai package (dev-only oracle) -----------------------

ACTION_REQUIRED = json.dumps(
    {
        "id": "evt_685c059ae3a481909bdc86819b066fb6",
        "object": "event",
        "created_at": NOW,
        "type": "agent.session.action_required",
        "data": {"id": "sess_123", "required_action": {"type": "function_call"}},
    }
).encode()


def test_openai_accepts_our_signed_headers() -> None:
    """openai's verify_signature and unwrap accept signed_headers output (one or two secrets)."""
    client = openai.OpenAI(api_key="sk-test", webhook_secret=SECRET)
    for secrets in (SECRET, [OLD_SECRET, SECRET]):
        headers = signed_headers(secrets, ACTION_REQUIRED)  # real clock: openai reads time.time
        client.webhooks.verify_signature(ACTION_REQUIRED, headers)
        event = client.webhooks.unwrap(ACTION_REQUIRED, headers)
        assert isinstance(event, AgentSessionActionRequiredWebhookEvent)
        assert event.data.id == "sess_123"
        assert (
            WebhookVerifier(SECRET).verify(ACTION_REQUIRED, headers).msg_id == headers["webhook-id"]
        )
    wrong = signed_headers(OTHER_SECRET, ACTION_REQUIRED)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.verify_signature(ACTION_REQUIRED, wrong)


def _openai_style_signature(secret: str, msg_id: str, timestamp: str, payload: bytes) -> str:
    """The signature openai/lib/_webhooks.py expects, computed by its own recipe."""
    decoded_secret = base64.b64decode(secret[6:])
    signed_payload = f"{msg_id}.{timestamp}.{payload.decode('utf-8')}"
    return base64.b64encode(
        hmac.new(decoded_secret, signed_payload.encode(), hashlib.sha256).digest()
    ).decode()


def test_we_accept_openai_algorithm_signature() -> None:
    """A signature made by openai's recipe, which openai itself accepts, verifies with us."""
    timestamp = str(int(time.time()))
    mac = _openai_style_signature(SECRET, MSG_ID, timestamp, ACTION_REQUIRED)
    headers = {
        "webhook-id": MSG_ID,
        "webhook-timestamp": timestamp,
        "webhook-signature": "v1," + mac,
    }
    client = openai.OpenAI(api_key="sk-test", webhook_secret=SECRET)
    client.webhooks.verify_signature(ACTION_REQUIRED, headers)
    assert WebhookVerifier(SECRET).verify(ACTION_REQUIRED, headers).msg_id == MSG_ID


@pytest.mark.parametrize(("secret", "msg_id", "timestamp", "body", "expected"), VECTORS)
def test_openai_agrees_on_vectors(
    secret: str, msg_id: str, timestamp: int, body: bytes, expected: str
) -> None:
    """openai's verifier (with a huge tolerance, it reads the real clock) accepts both vectors."""
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": expected,
    }
    client = openai.OpenAI(api_key="sk-test", webhook_secret=secret)
    client.webhooks.verify_signature(body, headers, tolerance=10**10)


def test_stricter_than_openai_on_bare_signature() -> None:
    """openai accepts a bare (unprefixed) MAC; we refuse it. Pins the documented difference."""
    timestamp = str(int(time.time()))
    mac = _openai_style_signature(SECRET, MSG_ID, timestamp, ACTION_REQUIRED)
    headers = {"webhook-id": MSG_ID, "webhook-timestamp": timestamp, "webhook-signature": mac}
    openai.OpenAI(api_key="sk-test", webhook_secret=SECRET).webhooks.verify_signature(
        ACTION_REQUIRED, headers
    )
    with pytest.raises(WebhookSignatureError):
        WebhookVerifier(SECRET).verify(ACTION_REQUIRED, headers)
