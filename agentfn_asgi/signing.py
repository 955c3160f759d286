"""Standard Webhooks v1 signing and verification, pure (no I/O, injected clock).

OpenAI signs every webhook delivery the Standard Webhooks way: HMAC-SHA256 over
``"{webhook-id}.{webhook-timestamp}.{raw body}"`` with the key inside a ``whsec_<base64>``
secret, sent as ``webhook-signature: v1,<base64> [v1,<base64> ...]``. This module checks
that with stricter rules than ``openai.lib._webhooks`` and the ``standardwebhooks`` package
(wire protocol §8.3):

* every malformed input raises a :class:`~agentfn_asgi.errors.WebhookVerificationError`
  subclass, never ``ValueError``, ``binascii.Error`` or ``UnicodeDecodeError``;
* header values must be printable ASCII of bounded length, the timestamp plain ASCII digits;
* only ``v1,<base64>`` entries are compared; unprefixed entries and other versions are
  ignored, and the base64 must be canonical and decode to exactly 32 bytes;
* secrets must carry the ``whsec_`` prefix with strict base64 after it;
* the body is the raw bytes as received and is never decoded.

::

    verifier = WebhookVerifier(webhook_secrets)   # one whsec_... or several (rotation)
    delivery = verifier.verify(raw_body, request.headers)           # raises on failure
    delivery.msg_id  # use as the idempotency key for the delivery
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import math
import re
import secrets as _secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from agentfn_asgi.errors import (
    ConfigurationError,
    WebhookHeaderError,
    WebhookSignatureError,
    WebhookTimestampError,
)

__all__ = [
    "VerifiedDelivery",
    "WebhookVerifier",
    "parse_secrets",
    "sign",
    "signed_headers",
]

SECRET_PREFIX = "whsec_"  # noqa: S105 - the format marker, not a secret
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
DEFAULT_TOLERANCE = 300.0

# Bounds on attacker-controlled headers. Real ids are ~35 chars ("wh_" + 32 hex), real
# signature headers hold one entry per active secret; the caps keep hostile input cheap.
_MAX_ID_LENGTH = 256
_MAX_TIMESTAMP_DIGITS = 12  # Unix seconds stay at 10 digits until the year 2286
_MAX_SIGNATURE_HEADER_LENGTH = 8192
_MAX_SIGNATURE_ENTRIES = 16

# A 32-byte MAC is 44 base64 characters ending in exactly one "=". The 43rd character then
# carries 4 data bits and 2 padding bits; decoders ignore the padding bits, so only the
# characters whose low 2 bits are zero give the one canonical spelling. Refusing the others
# keeps a valid signature from being re-spelled into a second accepted header value.
_MAC_LENGTH = 32
_MAC_B64_LENGTH = 44
_CANONICAL_LAST_DATA_CHARS = frozenset("AEIMQUYcgkosw048")

_SECRET_SEPARATORS = re.compile(r"[\s,]+")


@dataclass(frozen=True, slots=True)
class VerifiedDelivery:
    """An authentic webhook delivery.

    ``msg_id`` is the ``webhook-id`` header: it stays the same across the sender's retries,
    so it is the delivery's idempotency key. ``timestamp`` is the signed Unix time in
    seconds. ``secret_index`` is the position, in the verifier's parsed secret list, of the
    secret that matched (useful to see when an old secret stops being used after rotation).
    """

    msg_id: str
    timestamp: int
    secret_index: int


def parse_secrets(value: str | Sequence[str], *, what: str = "webhook secrets") -> tuple[str, ...]:
    """Split secrets given as one string or a sequence of strings.

    A string is split on whitespace and/or commas, so ``OPENAI_WEBHOOK_SECRET`` can hold
    the old and the new secret during a rotation (``"whsec_old,whsec_new"``). Items of a
    sequence are split the same way. Empty pieces are dropped; the result may be empty.
    The secrets are not decoded here (see :class:`WebhookVerifier`). ``what`` names them in
    errors (the same rule serves completion secrets and admin tokens).
    """
    if isinstance(value, str):
        items: Iterable[object] = (value,)
    elif isinstance(value, bytes | bytearray | memoryview):
        raise ConfigurationError(f"{what} must be str, not bytes")
    else:
        items = value
    result: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigurationError(f"{what} must be strings, got {type(item).__name__}")
        result.extend(piece for piece in _SECRET_SEPARATORS.split(item) if piece)
    return tuple(result)


def _decode_secret(secret: str) -> bytes:
    """Return the HMAC key inside a ``whsec_<base64>`` secret, or raise ConfigurationError.

    Error messages never include the secret itself.
    """
    if not secret.startswith(SECRET_PREFIX):
        raise ConfigurationError(
            "webhook secret must start with 'whsec_' (copy the whole signing secret of the "
            "webhook endpoint): without the prefix its meaning is ambiguous, because OpenAI's "
            "SDK uses such a secret as raw UTF-8 bytes while Standard Webhooks libraries "
            "base64-decode it, so the two would verify with different keys"
        )
    encoded = secret[len(SECRET_PREFIX) :]
    # Some tools print the secret without its base64 padding; restore it before the strict
    # decode, which rejects every other irregularity (stray characters, partial padding).
    if not encoded.endswith("="):
        encoded += "=" * (-len(encoded) % 4)
    try:
        key = binascii.a2b_base64(encoded, strict_mode=True)
    except ValueError as exc:  # binascii.Error, or non-ASCII text
        raise ConfigurationError(
            "webhook secret is not valid base64 after the 'whsec_' prefix"
        ) from exc
    if not key:
        raise ConfigurationError("webhook secret is empty after the 'whsec_' prefix")
    return key


def _signed_prefix(msg_id: str, timestamp: str) -> bytes:
    # The body follows this prefix; it is fed to the MAC separately so it is never copied.
    return f"{msg_id}.{timestamp}.".encode()


def _mac(key: bytes, prefix: bytes, body: bytes) -> bytes:
    mac = hmac.new(key, prefix, hashlib.sha256)
    mac.update(body)
    return mac.digest()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """Return the ``v1,<base64>`` signature of ``body`` as Standard Webhooks defines it.

    ``msg_id`` is not validated, so tests can sign hostile ids on purpose. Raises
    :class:`~agentfn_asgi.errors.ConfigurationError` if ``secret`` is not a valid
    ``whsec_`` secret.
    """
    digest = _mac(_decode_secret(secret), _signed_prefix(msg_id, str(int(timestamp))), body)
    return "v1," + binascii.b2a_base64(digest, newline=False).decode("ascii")


def signed_headers(
    secrets: str | Sequence[str],
    body: bytes,
    *,
    msg_id: str | None = None,
    timestamp: int | None = None,
    clock: Callable[[], float] = time.time,
) -> dict[str, str]:
    """Return the three ``webhook-*`` headers a Standard Webhooks sender would attach.

    ``secrets`` is parsed like :func:`parse_secrets`; the signature header holds one ``v1``
    entry per secret, as a sender does during a rotation. ``msg_id`` defaults to a random
    ``msg_<24 hex>`` and ``timestamp`` to ``int(clock())``.
    """
    parsed = parse_secrets(secrets)
    if not parsed:
        raise ConfigurationError("no webhook secret given")
    if msg_id is None:
        msg_id = "msg_" + _secrets.token_hex(12)
    ts = int(clock()) if timestamp is None else int(timestamp)
    return {
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: str(ts),
        SIGNATURE_HEADER: " ".join(sign(secret, msg_id, ts, body) for secret in parsed),
    }


def _header(headers: Mapping[str, str], name: str) -> str:
    """Look ``name`` (lowercase) up case-insensitively; raise if missing, empty or not str."""
    # ASGI servers lowercase header names and starlette's Headers.get ignores case, so the
    # direct lookup almost always hits; the scan covers plain dicts with "Webhook-Id".
    value: object = headers.get(name)
    if value is None:
        for key, candidate in headers.items():
            if isinstance(key, str) and key.lower() == name:
                value = candidate
                break
        else:
            raise WebhookHeaderError(f"missing {name} header")
    if not isinstance(value, str):
        raise WebhookHeaderError(f"{name} header is not text")
    if not value:
        raise WebhookHeaderError(f"empty {name} header")
    return value


def _is_visible_ascii(value: str) -> bool:
    # isprintable() on ASCII text excludes exactly the control characters (tab, CR, LF...).
    return value.isascii() and value.isprintable()


def _parse_signatures(header: str) -> tuple[bool, list[bytes]]:
    """Return (whether any ``v1`` entry exists, the well-formed ``v1`` MACs, decoded)."""
    has_v1 = False
    macs: list[bytes] = []
    entries = 0
    for entry in header.split(" "):
        if not entry:  # repeated, leading or trailing spaces
            continue
        entries += 1
        if entries > _MAX_SIGNATURE_ENTRIES:
            raise WebhookHeaderError(
                f"{SIGNATURE_HEADER} header has more than {_MAX_SIGNATURE_ENTRIES} entries"
            )
        version, comma, encoded = entry.partition(",")
        # Entries without a version ("<base64>") and other schemes (v1a = ed25519, v2...)
        # are skipped, not compared: OpenAI's verifier compares bare entries too, but
        # Standard Webhooks only defines "v1,".
        if version != "v1" or not comma:
            continue
        has_v1 = True
        if (
            len(encoded) != _MAC_B64_LENGTH
            or encoded[-1] != "="
            or encoded[-2] not in _CANONICAL_LAST_DATA_CHARS
        ):
            continue
        try:
            mac = binascii.a2b_base64(encoded, strict_mode=True)
        except ValueError:  # binascii.Error: a character outside the base64 alphabet
            continue
        if len(mac) == _MAC_LENGTH:
            macs.append(mac)
    return has_v1, macs


class WebhookVerifier:
    """Verify Standard Webhooks v1 deliveries against one or more secrets.

    ``secrets`` is one string or a sequence, parsed like :func:`parse_secrets`, so the value
    of ``OPENAI_WEBHOOK_SECRET`` can be passed as is; list both the old and the new secret
    during a rotation. Every secret must be ``whsec_<base64>``.

    ``tolerance`` (seconds) bounds how far the signed timestamp may lie from ``clock()``
    in either direction: older deliveries are replays, newer ones come from a skewed clock.

    Raises :class:`~agentfn_asgi.errors.ConfigurationError` for no secret, a malformed
    secret, or a negative or non-finite tolerance. Instances are immutable after
    construction and safe to share between threads and tasks.
    """

    __slots__ = ("_clock", "_macs", "_tolerance")

    def __init__(
        self,
        secrets: str | Sequence[str],
        *,
        tolerance: float = DEFAULT_TOLERANCE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        parsed = parse_secrets(secrets)
        if not parsed:
            raise ConfigurationError(
                "no webhook secret configured (set OPENAI_WEBHOOK_SECRET to the endpoint's "
                "'whsec_...' signing secret)"
            )
        tolerance = float(tolerance)
        if not math.isfinite(tolerance) or tolerance < 0:
            raise ConfigurationError("webhook timestamp tolerance must be a finite number >= 0")
        # Keyed once here: copying a keyed HMAC skips re-deriving the inner and outer pads
        # on every delivery (about a quarter of the cost for a 1 KiB body).
        self._macs = tuple(
            hmac.new(_decode_secret(secret), digestmod=hashlib.sha256) for secret in parsed
        )
        self._tolerance = tolerance
        self._clock = clock

    @property
    def tolerance(self) -> float:
        """Maximum distance, in seconds, between the signed timestamp and the clock."""
        return self._tolerance

    def verify(self, body: bytes, headers: Mapping[str, str]) -> VerifiedDelivery:
        """Check one delivery and return its id and timestamp, or raise.

        ``body`` must be the raw request bytes exactly as received; it is never decoded.
        ``headers`` is any mapping of header names to values (a dict, starlette's
        ``Headers``); names are matched case-insensitively.

        Raises (and raises nothing else, whatever the headers and body hold):

        * :class:`~agentfn_asgi.errors.WebhookHeaderError` (400): a header is missing,
          empty, too long, or not printable ASCII; the timestamp is not 1-12 ASCII digits;
          the signature header has more than 16 entries.
        * :class:`~agentfn_asgi.errors.WebhookTimestampError` (401): the timestamp is more
          than ``tolerance`` seconds away from the clock.
        * :class:`~agentfn_asgi.errors.WebhookSignatureError` (401): no ``v1`` entry, or no
          ``v1`` entry matches any secret.

        Passing ``body`` as ``str`` is a programming error and raises ``TypeError``.
        """
        if isinstance(body, str):
            raise TypeError(
                "body must be the raw request bytes, not str: re-encoding text "
                "can change the bytes that were signed"
            )

        msg_id = _header(headers, ID_HEADER)
        if len(msg_id) > _MAX_ID_LENGTH or not _is_visible_ascii(msg_id) or " " in msg_id:
            raise WebhookHeaderError(
                f"{ID_HEADER} header must be 1-{_MAX_ID_LENGTH} printable ASCII characters "
                "without spaces"
            )
        timestamp = _header(headers, TIMESTAMP_HEADER)
        # isdigit() alone would accept "١٢٣" or "²"; int() alone would accept " 1", "+1"
        # and "1_0". The MAC covers the raw string, so laxness here only blurs what was sent.
        if (
            len(timestamp) > _MAX_TIMESTAMP_DIGITS
            or not timestamp.isascii()
            or not timestamp.isdigit()
        ):
            raise WebhookHeaderError(
                f"{TIMESTAMP_HEADER} header must be 1-{_MAX_TIMESTAMP_DIGITS} ASCII digits"
            )
        signature = _header(headers, SIGNATURE_HEADER)
        if len(signature) > _MAX_SIGNATURE_HEADER_LENGTH or not _is_visible_ascii(signature):
            raise WebhookHeaderError(
                f"{SIGNATURE_HEADER} header must be at most {_MAX_SIGNATURE_HEADER_LENGTH} "
                "printable ASCII characters"
            )
        has_v1, candidates = _parse_signatures(signature)

        # Whole seconds, as both reference libraries compare, so the window edges are exact.
        sent_at = int(timestamp)
        skew = math.floor(self._clock()) - sent_at
        if skew > self._tolerance:
            raise WebhookTimestampError(f"{TIMESTAMP_HEADER} is too old ({skew} s ago)")
        if -skew > self._tolerance:
            raise WebhookTimestampError(f"{TIMESTAMP_HEADER} is too new ({-skew} s ahead)")

        if not has_v1:
            raise WebhookSignatureError(f"{SIGNATURE_HEADER} header has no v1 signature")
        if candidates:
            prefix = _signed_prefix(msg_id, timestamp)
            for index, keyed in enumerate(self._macs):
                mac = keyed.copy()
                mac.update(prefix)
                mac.update(body)
                expected = mac.digest()
                for candidate in candidates:
                    if hmac.compare_digest(expected, candidate):
                        return VerifiedDelivery(msg_id, sent_at, index)
        raise WebhookSignatureError("no webhook signature matches the configured secrets")
