"""The one parser of a caller's key (`Authorization: Bearer <key>`, or `x-api-key`) that
both HTTP tiers use.

Both tiers must read a header the same way: when the global tier and a router disagree on
what a key is (one matching `Bearer ` only, the other any case), the global tier's
residency rules can be walked around by a spelling the router still accepts."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

MAX_KEY_CHARS = 512
BEARER_HINT = "expected `Authorization: Bearer <key>`"


class AuthError(Exception):
    """401 for a missing, malformed or unknown key; 403 for a key that may not be served
    here; 400 for a header that is not printable ASCII (no key has such characters)."""

    def __init__(
        self, message: str, status: int = 401, code: str = "invalid_api_key", tenant: str = ""
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.code, self.tenant = message, status, code, tenant


def printable_ascii(value: str) -> bool:
    """Header values arrive decoded with surrogate escapes; anything beyond printable ASCII
    is no key, no session id and no class name of ours."""
    return value.isascii() and value.isprintable()


def bearer(header: str | None) -> str | None:
    """The key in `Authorization: Bearer <key>` (scheme in any case, RFC 9110 §11.1);
    None when the header is absent; AuthError when it is present but no bearer key."""
    if header is None:
        return None
    if not printable_ascii(header):
        raise AuthError(
            f"Authorization header has bytes that are not printable ASCII; {BEARER_HINT}",
            status=400,
            code="invalid_authorization_header",
        )
    scheme, _, key = header.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key or " " in key or len(key) > MAX_KEY_CHARS:
        raise AuthError(f"malformed Authorization header; {BEARER_HINT}")
    return key


API_KEY_HEADER = "x-api-key"  # Anthropic's clients send the key here instead


def client_key(headers: Mapping[str, str]) -> str | None:
    """The caller's key from the headers a tier read (gpuroute/headers.py `interpreted`):
    `Authorization: Bearer <key>`, or Anthropic's `x-api-key: <key>`. Both tiers read it
    here, the one way: both headers with different keys is a 400 (two readers must never
    pick different keys), a malformed one a 401."""
    bearer_key = bearer(headers.get("authorization"))
    other = headers.get(API_KEY_HEADER)
    if other is None:
        return bearer_key
    other = other.strip()
    if not printable_ascii(other) or not other or " " in other or len(other) > MAX_KEY_CHARS:
        raise AuthError("malformed x-api-key header; expected `x-api-key: <key>`")
    if bearer_key is not None and bearer_key != other:
        raise AuthError(
            "Authorization and x-api-key name different keys; send one",
            status=400,
            code="conflicting_api_keys",
        )
    return other


def key_digest(key: str) -> str:
    """What configs store instead of keys: the key's sha256, lowercase hex."""
    return hashlib.sha256(key.encode()).hexdigest()
